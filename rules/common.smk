# Config access, paths and input functions. Every rule goes through these.
import hashlib
import json
import os
import shlex
import sys

from snakemake.exceptions import WorkflowError

SCRIPTS = os.path.join(workflow.basedir, "scripts")
sys.path.insert(0, SCRIPTS)
from budgetgen import state  # noqa: E402  (the one definition of a dataset's state)
from budgetgen.journal import scan as scan_journal  # noqa: E402
from budgetgen.params import params_sha256, request_params  # noqa: E402
from budgetgen.tokenization import tokenizer_sha256  # noqa: E402

DATASETS = sorted(config["datasets"])


wildcard_constraints:
    dataset="[A-Za-z0-9][A-Za-z0-9_.-]*",


def gen(dataset, key):
    """A generation setting of one dataset: its own override, else the `generation` default."""
    own = config["datasets"][dataset]
    return own[key] if key in own else config["generation"].get(key)


def token_budget(dataset):
    return int(gen(dataset, "token_budget"))


def source_config(dataset):
    """datasets.D.source (a `datasets` source), or None for a plain prompts file."""
    return config["datasets"][dataset].get("source")


def prompts_path(dataset):
    """The dataset's prompts.jsonl: its own file, or the one imported from its `source`."""
    if source_config(dataset) is not None:
        return f"results/{dataset}/prompts.jsonl"
    return config["datasets"][dataset]["prompts"]


def imported_prompts(wildcards):
    """The imported prompts.jsonl of a `source` dataset (ancient: a re-import reruns nothing by
    mtime alone), so the status checkpoint can read it; nothing for a plain prompts file."""
    if source_config(wildcards.dataset) is None:
        return []
    return [ancient(prompts_path(wildcards.dataset))]


# The journal is deliberately never a declared output: Snakemake deletes declared outputs of
# failed or killed jobs, and the journal is the GPU time already paid for.
def journal_path(dataset):
    return f"results/{dataset}/journal.jsonl"


def errors_path(dataset):
    return f"results/{dataset}/errors.jsonl"


def status_path(dataset):
    return f"results/{dataset}/budget_status.json"


def done_path(dataset):
    return f"results/{dataset}/inference.done"


# Settings that change what a dataset's data is (not how fast or how robustly it is made).
CONTENT_GENERATION_KEYS = ("token_budget", "max_tokens", "temperature", "top_p", "seed", "extra_body")


def config_sha256(dataset):
    """Hash of the dataset's content-affecting config, recorded in its tokenized.arrow."""
    content = {
        "model": config["server"]["model"],
        "generation": {k: gen(dataset, k) for k in CONTENT_GENERATION_KEYS},
        "tokenizer": {k: v for k, v in config["tokenizer"].items() if k != "processes"},
    }
    blob = json.dumps(content, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


def current_params_sha(dataset):
    """Hash of the request parameters the dataset's next inference job will send (errors recorded
    under other parameters do not count against its prompts)."""
    return params_sha256(
        request_params(
            config["server"]["model"],
            gen(dataset, "max_tokens"),
            gen(dataset, "temperature"),
            gen(dataset, "top_p"),
            gen(dataset, "extra_body"),
        )
    )


def chat_template_kwargs(dataset):
    return (gen(dataset, "extra_body") or {}).get("chat_template_kwargs") or {}


def check_config():
    """Errors a schema cannot express, as one line naming the key."""
    for ds in DATASETS:
        own, source = config["datasets"][ds], source_config(ds)
        if ("prompts" in own) == (source is not None):
            raise WorkflowError(f"config key datasets.{ds}: give exactly one of prompts or source")
        if source is not None:
            if not os.path.exists(source["path"]):
                raise WorkflowError(f"config key datasets.{ds}.source.path: not found: {source['path']}")
        elif not os.path.isfile(own["prompts"]):
            raise WorkflowError(f"config key datasets.{ds}.prompts: file not found: {own['prompts']}")
        if gen(ds, "token_budget") is None:
            raise WorkflowError(
                f"config key generation.token_budget (or datasets.{ds}.token_budget) is required"
            )
    if not config["server"].get("base_url") and not config["server"].get("launch"):
        raise WorkflowError(
            "config key server.base_url is required (or server.launch, a server each job starts)"
        )
    env = config["server"].get("api_key_env")
    if env and not os.environ.get(env):
        print(
            f"warning: server.api_key_env names {env}, which is not set in this environment", file=sys.stderr
        )


check_config()


def tokenizer_problem(name):
    """Why tokenizer.path cannot be loaded (as tokenization.load_tokenizer decides), or None: a
    folder, or a hub name (org/model) already in the local Hugging Face cache."""
    if os.path.isdir(name):
        return None
    if state.looks_local(name):
        return f"config key tokenizer.path: no such folder: {name}"
    from huggingface_hub import try_to_load_from_cache

    for filename in ("tokenizer_config.json", "tokenizer.json"):
        if isinstance(try_to_load_from_cache(name, filename), str):
            return None
    return f"config key tokenizer.path: no such folder, and not in the local Hugging Face cache: {name}"


def check_tokenizer_before_jobs():
    """Called from the Snakefile's onstart: when jobs are about to run (not at parse time, so
    `snakemake -n` and `--lint` work on a clone whose tokenizer is not built yet), and only if a
    tokenize job is among them."""
    if any(job.rule.name == "tokenize" for job in workflow.dag.needrun_jobs()):
        problem = tokenizer_problem(config["tokenizer"]["path"])
        if problem:
            raise WorkflowError(problem)


def dataset_files(dataset):
    return state.DatasetFiles(
        journal=journal_path(dataset),
        done=done_path(dataset),
        status=status_path(dataset),
        prompts=prompts_path(dataset),
    )


def raw_responses_input(wildcards):
    """Finalize straight from the journal when the checkpoint says met or exhausted (no inference
    job); otherwise through the inference job's done marker (see budgetgen.state)."""
    ds = wildcards.dataset
    if os.path.exists(done_path(ds)) or not os.path.exists(journal_path(ds)):
        # no need to wait for the checkpoint: a dry-run on a fresh tree already lists inference
        return [done_path(ds)]
    status = state.read_json(checkpoints.budget_status.get(dataset=ds).output[0])
    if state.finalize_from_journal(dataset_files(ds), token_budget(ds), current_params_sha(ds), status):
        return [journal_path(ds)]
    return [done_path(ds)]


def journal_counts(path):
    found = scan_journal(path)
    return found.tokens, found.records


def print_status_table():
    """Tokens done and left per dataset, at DAG time (so `snakemake -n` shows it too)."""
    if workflow.is_main_process:
        rows = [
            state.status_row(ds, dataset_files(ds), token_budget(ds), current_params_sha(ds), journal_counts)
            for ds in DATASETS
        ]
        print(state.format_status_table(rows), file=sys.stderr)


print_status_table()
