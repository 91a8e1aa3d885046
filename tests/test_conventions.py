"""The project's conventions, checked by the tools that define them: `snakemake --lint`, snakefmt,
ruff (configured in pyproject.toml), and the conda environment installing the pinned requirements."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import REPO

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
