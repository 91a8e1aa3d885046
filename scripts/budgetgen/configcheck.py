"""Config checks the Snakefile runs before any job, each giving one line that names the key.

- Duplicate keys in a config file: YAML (and JSON) loaders silently keep the last of two equal
  keys, so a second `datasets: A:` entry would replace the first without a word. The files are
  re-read here with a loader that refuses them, naming file:line and the dotted key.
- Schema errors: jsonschema's best match, as `config key server.base_url: ...` (snakemake's own
  validation prints the whole schema fragment, which hides the key). A key the schema forbids with
  `not: {}` reads `not allowed here (DESCRIPTION)`, `{section}` in the key's description being the
  path two levels above the key (generation or datasets.D for an extra_body key).
- What a schema cannot check (config_problem): files, budgets, mixtures, and every chat_template_kwargs
  key read by the target's chat template (budgetgen.template_check).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import yaml

from .settings import dataset_mixture, generation_setting

if TYPE_CHECKING:
    import os
    from collections.abc import Iterable, Mapping
    from typing import Any

_MERGE = "tag:yaml.org,2002:merge"
_MESSAGE_MAX = 300
# markers of passed chat-template checks (budgetgen.template_check), in the working directory
TEMPLATE_CHECK_CACHE = ".snakemake/budgetgen/template_check"
# verdicts on the prompts files (budgetgen.prompts_check: would the job load each), in the working directory
PROMPTS_CHECK_CACHE = ".snakemake/budgetgen/prompts_check.json"


def duplicate_key(path: str | os.PathLike) -> str | None:
    """The first duplicate mapping key in a YAML/JSON config file, as a message; None if there is none.

    A file that cannot be read or parsed gives None: snakemake reports it on its own.
    """
    try:
        with open(path, encoding="utf-8") as f:
            root = yaml.compose(f, Loader=yaml.SafeLoader)
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    seen = set()

    def walk(node, prefix):
        if node is None or id(node) in seen:  # an alias shares its anchor's node
            return None
        seen.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                found = walk(item, f"{prefix}[{i}].")
                if found:
                    return found
        elif isinstance(node, yaml.MappingNode):
            first = {}
            for key, value in node.value:
                if not isinstance(key, yaml.ScalarNode) or key.tag == _MERGE:  # `<<:` may override
                    found = walk(value, prefix)
                else:
                    name, line = f"{prefix}{key.value}", key.start_mark.line + 1
                    if (key.tag, key.value) in first:
                        return (f"{path}:{line}: duplicate config key {name} (first given on line "
                                f"{first[key.tag, key.value]}); YAML would silently keep only the last one")
                    first[key.tag, key.value] = line
                    found = walk(value, name + ".")
                if found:
                    return found
        return None

    return walk(root, "")


def schema_error(config: object, schema_path: str | os.PathLike) -> str | None:
    """The most relevant schema violation of config, as `config key KEY: reason`; None if valid."""
    import jsonschema
    from jsonschema.exceptions import best_match

    with open(schema_path, encoding="utf-8") as f:
        schema = yaml.safe_load(f)
    cls = jsonschema.validators.validator_for(schema)
    err = best_match(cls(schema).iter_errors(config))
    if err is None:
        return None
    path = [str(p) for p in err.absolute_path]
    message = err.message
    if err.validator == "additionalProperties" and isinstance(err.instance, dict):
        known = sorted(err.schema.get("properties") or {})
        unknown = sorted(k for k in err.instance if k not in known)
        if unknown:
            path.append(str(unknown[0]))
            message = "unknown key" + (f" (known keys: {', '.join(known)})" if known else "")
    elif err.validator == "not" and err.validator_value == {}:
        hint = str(err.schema.get("description") or "").replace("{section}", ".".join(path[:-2]))
        message = "not allowed here" + (f" ({hint})" if hint else "")
    elif "propertyNames" in err.schema_path:
        message = f"invalid name: {message}"
    elif err.validator in ("anyOf", "oneOf") and all(
        isinstance(s, dict) and list(s) == ["required"] for s in err.validator_value
    ):
        names = [k for s in err.validator_value for k in s["required"]]
        given = [k for k in names if isinstance(err.instance, dict) and k in err.instance]
        if err.validator == "oneOf":
            message = f"give exactly one of {' or '.join(names)}" + (f" (got {' and '.join(given)})" if given else "")
        else:
            message = f"give one of {' or '.join(names)}"
    elif err.validator == "required" and err.validator_value:
        missing = [k for k in err.validator_value if isinstance(err.instance, dict) and k not in err.instance]
        if missing:
            path.append(str(missing[0]))
            message = "required key is missing"
    if len(message) > _MESSAGE_MAX:
        message = message[: _MESSAGE_MAX - 3] + "..."
    return f"config key {'.'.join(path) or '(top level)'}: {message}"


def not_found(key: str, path: str, configfiles: Iterable[str | os.PathLike] = (),
              what: str = "file not found") -> str:
    """The one line of a path in the config that does not exist: which directory a relative path was read
    from (the working directory: snakemake -d), and whether it exists beside a config file instead."""
    import os

    line = f"config key {key}: {what}: {path}"
    if os.path.isabs(path):
        return line
    line += f" (relative paths in the config are read from the working directory {os.getcwd()}, snakemake -d"
    beside = [os.path.dirname(os.path.abspath(f)) for f in configfiles
              if os.path.exists(os.path.join(os.path.dirname(os.path.abspath(f)), path))]
    if beside and beside[0] != os.getcwd():
        line += f"; it exists in {beside[0]}, beside the config file: give it as {os.path.join(beside[0], path)}"
    return line + ")"


def thinking_budget_keys(config: dict[str, Any]) -> list[str]:
    """The config keys that ask a thinking budget of the server (a dataset's or the generation's, a cell's)."""
    keys = []
    for ds in sorted(config["datasets"]):
        own = config["datasets"][ds]
        if generation_setting(config, ds, "thinking_budget") is not None:
            keys.append(f"datasets.{ds}.thinking_budget" if "thinking_budget" in own else "generation.thinking_budget")
        for name, cell in (generation_setting(config, ds, "mixture") or {}).items():
            if cell.get("thinking_budget") is not None:
                keys.append(f"datasets.{ds}.mixture.{name}.thinking_budget")
    return keys


def config_problem(config: dict[str, Any], configfiles: Iterable[str | os.PathLike] = ()) -> str | None:
    """What a schema cannot check, as one line naming the key, or None: server.engine and
    server.return_token_ids agree (budgetgen.engines), the files a dataset names
    exist (a relative path from the working directory; `configfiles`: the config files given, named in
    the line when the path exists beside one of them), every dataset has a token budget (its own or
    generation's), its mixture is sound, and the chat_template_kwargs are read by the target's chat
    template (budgetgen.template_check)."""
    import os

    from .engines import engine_problem, thinking_problem

    problem = engine_problem(config["server"])
    if problem:
        return problem
    for key in thinking_budget_keys(config):
        problem = thinking_problem(config["server"], key)
        if problem:
            return problem
    canary = config["server"].get("canary")
    if canary and not os.path.isfile(canary["prompts"]):
        return not_found("server.canary.prompts", canary["prompts"], configfiles)
    model_config = config["tokenizer"].get("model_config")
    if model_config and not os.path.isfile(model_config):
        return not_found("tokenizer.model_config", model_config, configfiles)
    for ds in sorted(config["datasets"]):
        own = config["datasets"][ds]
        source = own.get("source")
        if source is not None:
            if not os.path.exists(source["path"]):
                return not_found(f"datasets.{ds}.source.path", source["path"], configfiles, what="not found")
        elif not os.path.isfile(own["prompts"]):
            return not_found(f"datasets.{ds}.prompts", own["prompts"], configfiles)
        if generation_setting(config, ds, "token_budget") is None:
            return f"config key generation.token_budget (or datasets.{ds}.token_budget) is required"
        problem = mixture_problem(config, ds)
        if problem:
            return problem
    from .prompts_check import prompts_problem
    from .template_check import template_problem

    return prompts_problem(config, PROMPTS_CHECK_CACHE) or template_problem(config, cache_dir=TEMPLATE_CHECK_CACHE)


def mixture_problem(config: dict[str, Any], ds: str) -> str | None:
    """A mixture whose shares do not sum to 1, or two of whose cells have the same generation settings
    (one identity: their records could not be told apart), as one line naming the key; else None."""
    where = f"datasets.{ds}.mixture" if config["datasets"][ds].get("mixture") else "generation.mixture"
    cells = config["datasets"][ds].get("mixture") or config["generation"].get("mixture")
    if not cells:
        return None
    total = sum(float(c["share"]) for c in cells.values())
    if abs(total - 1) > 1e-6:
        return f"config key {where}: the cells' shares sum to {total:g}, not 1"
    seen = {}
    for cell in dataset_mixture(config, ds).cells:
        other = seen.setdefault(cell.identity.sha, cell.name)
        if other != cell.name:
            return (f"config key {where}: cells {other} and {cell.name} have the same generation settings "
                    f"(dataset {ds}); give each cell the settings that make it a cell")
    return None


def api_key_warning(config: dict[str, Any], environ: Mapping[str, str]) -> str | None:
    """A warning line when server.api_key_env names a variable that is not set, else None."""
    env = config["server"].get("api_key_env")
    if env and not environ.get(env):
        return f"warning: server.api_key_env names {env}, which is not set in this environment"
    return None


def identical_samples_warning(config: dict[str, Any]) -> str | None:
    """A warning line per dataset whose samples_per_prompt > 1 would give identical samples (greedy
    decoding, or a fixed sampling seed in extra_body), else None."""
    lines = []
    for ds in sorted(config["datasets"]):
        g = lambda key, ds=ds: generation_setting(config, ds, key)  # noqa: E731
        if int(g("samples_per_prompt") or 1) < 2:
            continue
        why = ("temperature 0" if g("temperature") == 0 else
               "a fixed seed in extra_body" if (g("extra_body") or {}).get("seed") is not None else None)
        if why:
            lines.append(f"warning: dataset {ds}: samples_per_prompt {g('samples_per_prompt')} with {why} gives "
                         "identical samples; set a temperature above 0 and no fixed seed")
    return "\n".join(lines) or None


def small_lane_warning(config: dict[str, Any]) -> str | None:
    """A warning line per dataset with a lane (a mixture cell in a split; budgetgen.mixture) whose budget line
    is under 2 x its cell's max_tokens: one response can add up to max_tokens past such a line (met means
    tokens >= the line), so the lane may end far above it, or take the few prompts of a small split
    another lane needed; else None."""
    lines = []
    for ds in sorted(config["datasets"]):
        small = [(lane.key, lane.budget, lane.cell.max_tokens) for lane in dataset_mixture(config, ds).lanes
                 if lane.budget < 2 * lane.cell.max_tokens]
        if small and len(dataset_mixture(config, ds).lanes) > 1:
            what = ", ".join(f"{key} {budget} tokens (max_tokens {mt}: up to {100 * (budget + mt) / budget:.0f} %)"
                             for key, budget, mt in small)
            lines.append(f"warning: dataset {ds}: lines under 2 x max_tokens: {what}; raise the dataset's "
                         "token_budget or validation.share, or lower max_tokens")
    return "\n".join(lines) or None


def tokenizer_problem(name: str) -> str | None:
    """Why tokenizer.path cannot be loaded (as turn_format.load_tokenizer decides), or None: a folder,
    or a hub name (org/model) already in the local Hugging Face cache."""
    import os

    from .state import looks_local

    if os.path.isdir(name):
        return None
    if looks_local(name):
        return f"config key tokenizer.path: no such folder: {name}"
    from huggingface_hub import try_to_load_from_cache

    for filename in ("tokenizer_config.json", "tokenizer.json"):
        if isinstance(try_to_load_from_cache(name, filename), str):
            return None
    return f"config key tokenizer.path: no such folder, and not in the local Hugging Face cache: {name}"
