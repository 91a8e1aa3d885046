"""The project's conventions, checked by the tools that define them: `snakemake --lint`, snakefmt,
ruff (configured in pyproject.toml), and the conda environment installing the pinned requirements;
and the layout: the product never imports the test kit, and the README's developer map and each
package's docstring list every module."""

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from support import REPO

BIN = Path(sys.executable).parent


def tool(name):
    """The venv's copy of a tool (pinned in requirements-test.txt), else one on PATH; skip if none."""
    path = BIN / name if (BIN / name).exists() else shutil.which(name)
    if path is None:
        pytest.skip(f"{name} not installed (bin/setup --test installs it)")
    return str(path)


def run(*cmd):
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    proc.output = proc.stdout + proc.stderr
    return proc


def test_snakemake_lint_is_clean():
    proc = run(sys.executable, "-m", "snakemake", "--lint")
    if proc.returncode or "Congratulations, your workflow is in a good condition!" not in proc.output:
        pytest.fail(proc.output[-4000:])


def test_snakefmt_check_is_clean():
    snakefmt = tool("snakefmt")
    if run(snakefmt, "--check", "Snakefile", "rules/").returncode:
        pytest.fail(run(snakefmt, "--diff", "Snakefile", "rules/").output[-4000:])


def test_ruff_check_is_clean():
    paths = [p for p in ("scripts", "tests", "bench") if (REPO / p).is_dir()]
    proc = run(tool("ruff"), "check", "--no-cache", *paths)
    if proc.returncode:
        pytest.fail(proc.output[-4000:])


def pins(path):
    """name -> version of each `name==version` line, following -r includes."""
    out = {}
    for line in Path(path).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("-r "):
            out.update(pins(Path(path).parent / line[3:].strip()))
        elif "==" in line:
            name, version = line.split("==", 1)
            out[re.sub(r"\[.*\]", "", name).strip().lower()] = version.strip()
    return out


def test_every_rule_uses_a_conda_env_that_installs_the_pinned_requirements():
    rule_envs = set()
    for smk in [REPO / "Snakefile", *sorted((REPO / "rules").glob("*.smk"))]:
        for env in re.findall(r'^\s+conda:\s*\n\s+"([^"]+)"', smk.read_text(), re.M):
            rule_envs.add((smk.parent / env).resolve())
    assert rule_envs, "no rule has a conda: directive"
    requirements = pins(REPO / "requirements.txt")
    assert requirements, "requirements.txt pins nothing"
    requires_python = re.search(r'requires-python = ">=(\d+\.\d+)"', (REPO / "pyproject.toml").read_text()).group(1)
    for env_path in sorted(rule_envs):
        assert env_path.exists(), f"conda env {env_path} named by a rule does not exist"
        env = yaml.safe_load(env_path.read_text())
        deps = env["dependencies"]
        pip = next(d["pip"] for d in deps if isinstance(d, dict) and "pip" in d)
        assert "-r ../requirements.txt" in pip, f"{env_path.name}: pip must install -r ../requirements.txt"
        assert (env_path.parent / "../requirements.txt").resolve() == (REPO / "requirements.txt").resolve()
        conda = {re.split(r"[=<>]", d, maxsplit=1)[0].strip(): d for d in deps if isinstance(d, str)}
        assert conda.get("python") == f"python={requires_python}", f"{env_path.name}: {conda.get('python')}"
        # a package named both in conda and in requirements.txt must be the pinned version
        for name, spec in conda.items():
            if name.lower() in requirements:
                assert spec == f"{name}={requirements[name.lower()]}", f"{env_path.name}: {spec}"


def rule_blocks():
    """(file, rule name, body) of every rule and checkpoint in rules/*.smk."""
    for path in sorted((REPO / "rules").glob("*.smk")):
        text = path.read_text()
        starts = [(m.start(), m.group(2)) for m in re.finditer(r"^(rule|checkpoint) (\w+):", text, re.M)]
        for (start, name), (end, _) in zip(starts, starts[1:] + [(len(text), None)]):
            yield path.name, name, text[start:end]


def test_every_rule_has_log_and_benchmark():
    blocks = list(rule_blocks())
    assert len(blocks) >= 7
    missing = [f"{f}:{name}" for f, name, body in blocks
               if re.search(r"^    output:", body, re.M)  # target rules (only inputs) run nothing
               and not (re.search(r"^    log:", body, re.M) and re.search(r"^    benchmark:", body, re.M))]
    assert not missing, f"rules without log: or benchmark: {missing}"


def test_every_script_has_help():
    scripts = sorted((REPO / "scripts").glob("*.py"))
    assert len(scripts) >= 8
    for script in scripts:
        proc = run(sys.executable, str(script), "--help")
        assert proc.returncode == 0 and "usage:" in proc.stdout, f"{script.name} --help: {proc.output[-500:]}"


def schema_keys(node, prefix):
    """Dotted config keys the schema defines (dataset-level generation overrides excluded)."""
    for name, sub in (node.get("properties") or {}).items():
        if "$ref" in sub and prefix.startswith("datasets."):  # the per-dataset generation overrides
            continue
        key = f"{prefix}{name}"
        yield key
        yield from schema_keys(sub, key + ".")
    extra = node.get("additionalProperties")
    if isinstance(extra, dict) and extra.get("type") == "object" and "properties" in extra:
        yield from schema_keys(extra, prefix + "NAME.")


def test_readme_configuration_reference_matches_the_schema():
    schema = yaml.safe_load((REPO / "schemas" / "config.schema.yaml").read_text())
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Configuration", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"^\| `([^`]+)` \|", section, re.M))
    keys = {k for k in schema_keys(schema, "") if k.count(".") >= 1}
    assert keys - documented == set(), "schema keys missing from the README's configuration table"
    stale = {k for k in documented - keys if "<" not in k}
    assert stale == set(), "README documents keys the schema does not have"


def imported_modules(path):
    """Top-level names of every module a Python file imports (absolute imports only)."""
    tree = ast.parse(Path(path).read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module.split(".")[0]


def test_the_product_never_imports_the_test_kit():
    """budgetgen_testkit depends on budgetgen, never the reverse; no rule or workflow entry point uses it
    (scripts/mock_server.py and make_demo_tokenizer.py are the test kit's own commands)."""
    kit_commands = {"mock_server.py", "make_demo_tokenizer.py"}
    product = [*(REPO / "scripts" / "budgetgen").glob("*.py"),
               *(p for p in (REPO / "scripts").glob("*.py") if p.name not in kit_commands)]
    offenders = [p.relative_to(REPO) for p in product if "budgetgen_testkit" in set(imported_modules(p))]
    assert not offenders, f"the product imports budgetgen_testkit: {offenders}"
    for smk in [REPO / "Snakefile", *(REPO / "rules").glob("*.smk")]:
        assert "budgetgen_testkit" not in smk.read_text(), f"{smk.name} names budgetgen_testkit"


def test_no_import_circle_between_the_config_modules_and_tokenize_modules_stay_small():
    """budgetgen.configcheck imports budgetgen.settings and not the reverse (the config file itself is
    read by budgetgen.configfile); the tokenize job's three modules (turn_format, rows, tokenization)
    stay within 400 lines each (issue 22)."""
    pkg = REPO / "scripts" / "budgetgen"
    tree = ast.parse((pkg / "settings.py").read_text())
    settings_imports = {node.module.rsplit(".", 1)[-1] for node in ast.walk(tree)
                        if isinstance(node, ast.ImportFrom) and node.module}
    assert settings_imports and not settings_imports & {"configcheck", "configfile"}, settings_imports
    for name in ("turn_format", "rows", "tokenization"):
        lines = len((pkg / f"{name}.py").read_text().splitlines())
        assert lines <= 400, f"budgetgen/{name}.py has {lines} lines"


def package_imports(pkg):
    """{module: {package modules it imports}} of every module of the package at `pkg`, counting every
    import: at the top, inside a function, under `if TYPE_CHECKING:` (relative or absolute)."""
    modules = {p.stem for p in pkg.glob("*.py")} - {"__init__"}
    graph = {}
    for name in modules:
        found = set()
        for node in ast.walk(ast.parse((pkg / f"{name}.py").read_text())):
            if isinstance(node, ast.ImportFrom):
                if node.level == 1 or (node.module or "").split(".")[0] == pkg.name:
                    parts = (node.module or "").split(".")
                    head = parts[0] if node.level == 1 else (parts[1] if len(parts) > 1 else "")
                    found |= {head} if head else {a.name for a in node.names}
            elif isinstance(node, ast.Import):
                found |= {a.name.split(".")[1] for a in node.names if a.name.startswith(pkg.name + ".")}
        graph[name] = (found & modules) - {name}
    return graph


def test_the_product_package_imports_go_one_way():
    """No import loop in budgetgen, counting the imports inside functions and under TYPE_CHECKING (issue 40:
    a loop kept out of Python's way by a lazy import is still a loop: the modules cannot be read, moved or
    tested one without the other)."""
    graph = package_imports(REPO / "scripts" / "budgetgen")
    loops, state = [], {}

    def visit(node, path):
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                loops.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert not loops, "import loops: " + "; ".join(" -> ".join(loop) for loop in loops)


@pytest.mark.parametrize("package", ["budgetgen", "budgetgen_testkit"])
def test_readme_developer_map_and_package_docstring_list_every_module(package):
    modules = sorted(p.stem for p in (REPO / "scripts" / package).glob("*.py") if p.stem != "__init__")
    readme = (REPO / "README.md").read_text().split("## Development", 1)[1]
    block = readme.split(f"scripts/{package}/", 1)[1].split("\n", 1)[1]
    listed = re.findall(r"^  (\w+)\s", block, re.M)  # the module lines under the package's line
    missing = [m for m in modules if m not in listed]
    assert not missing, f"README's developer map does not list {package} modules {missing}"
    docstring = ast.get_docstring(ast.parse((REPO / "scripts" / package / "__init__.py").read_text()))
    missing = [m for m in modules if not re.search(rf"^  {m}\s", docstring, re.M)]
    assert not missing, f"{package}/__init__.py's docstring does not list modules {missing}"


# Wire names only an engine uses: only budgetgen.engines may name them. The client (which reads the wire)
# may not name the ones that are also the journal's or a config key's either (reasoning_content,
# prompt_token_ids, return_token_ids, continuous_usage_stats): it asks its dialect.
ENGINE_ONLY = {"sglext", "return_input_ids_in_sglext", "return_output_ids_in_sglext", "token_ids", "output_ids",
               "include_usage", "include_reasoning", "continuous_usage_stats"}
WIRE_NAMES = ENGINE_ONLY | {"reasoning", "reasoning_content", "prompt_token_ids", "return_token_ids"}


def test_only_the_engines_module_knows_engine_field_names():
    found = []
    for path in sorted((REPO / "scripts" / "budgetgen").glob("*.py")):
        if path.name == "engines.py":
            continue
        names = WIRE_NAMES if path.name == "client.py" else ENGINE_ONLY - {"continuous_usage_stats"}
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names:
                found.append(f"{path.name}:{node.lineno} {node.value!r}")
    assert not found, "engine field names outside budgetgen.engines: " + ", ".join(found)


MODULE_LINES, CLASS_LINES, FUNCTION_LINES = 400, 150, 60


def test_the_product_package_keeps_modules_classes_and_functions_small():
    """budgetgen's modules at most 400 lines, classes 150, functions 60 (docstrings included): a module
    that grows past them is split by concern, as inference (plan, progress, retries) and client
    (endpoints, engines) were."""
    too_big = []
    for path in sorted((REPO / "scripts" / "budgetgen").glob("*.py")):
        text = path.read_text()
        if len(text.splitlines()) > MODULE_LINES:
            too_big.append(f"{path.name}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            size = getattr(node, "end_lineno", 0) - getattr(node, "lineno", 0) + 1
            if isinstance(node, ast.ClassDef) and size > CLASS_LINES:
                too_big.append(f"{path.name}: class {node.name} {size} lines")
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and size > FUNCTION_LINES:
                too_big.append(f"{path.name}: {node.name}() {size} lines")
    assert not too_big, f"over {MODULE_LINES}/{CLASS_LINES}/{FUNCTION_LINES} lines: " + "; ".join(too_big)


def test_dataset_paths_are_written_once_and_rules_hand_their_files_to_the_scripts():
    """Every dataset file's pattern lives in budgetgen.settings.DatasetPaths.PATTERNS: no rule spells one
    out (they use path_of), and every entry point that takes --dataset passes the rule's declared files
    on (snakemake_paths) and builds its settings with them (declared_files)."""
    from budgetgen.settings import DatasetPaths

    rules = {p.name: p.read_text() for p in [REPO / "Snakefile", *sorted((REPO / "rules").glob("*.smk"))]}
    spelled = [f"{name}: {pattern}" for name, text in rules.items() for pattern in DatasetPaths.PATTERNS.values()
               if f'"{pattern}"' in text]
    assert not spelled, "dataset paths spelt out in rules (use path_of): " + ", ".join(spelled)
    for script in ("run_inference.py", "budget_status.py", "finalize.py", "tokenize_responses.py"):
        text = (REPO / "scripts" / script).read_text()
        assert "snakemake_paths(smk.input, smk.output)" in text and "files=declared_files(a)" in text, script


def test_the_product_packages_public_functions_carry_type_hints():
    """Every public function and method of budgetgen (a name without a leading underscore, of the module
    or of a public class) annotates its parameters and its return."""
    bare = []
    for path in sorted((REPO / "scripts" / "budgetgen").glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            functions = [node] if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else []
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                functions = [n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
            for f in functions:
                if f.name.startswith("_"):
                    continue
                args = [a for a in f.args.args + f.args.kwonlyargs if a.arg not in ("self", "cls")]
                if f.returns is None or any(a.annotation is None for a in args):
                    bare.append(f"{path.name}:{f.lineno} {f.name}")
    assert not bare, "public functions without type hints: " + ", ".join(bare)


def test_the_local_steps_are_the_rules_marked_localrule():
    """Under a cluster executor only what needs a node is submitted: the rules with `localrule: True` are
    exactly budgetgen.cluster.LOCAL_STEPS (the list the dry-run prints)."""
    from budgetgen import cluster

    local = {name for _, name, body in rule_blocks() if re.search(r"^    localrule: True$", body, re.M)}
    assert local == set(cluster.LOCAL_STEPS)
    assert {"inference", "tokenize"}.isdisjoint(local)  # the work a node is for


def test_test_modules_have_unique_basenames():
    """pytest imports test modules by basename (rootdir, no __init__.py): two of one name break collection."""
    names = [p.name for p in (REPO / "tests").rglob("test_*.py")]
    assert not sorted({n for n in names if names.count(n) > 1})
