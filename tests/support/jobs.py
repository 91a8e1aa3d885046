"""The inference job run directly (`scripts/run_inference.py --config FILE --dataset D`, the command
rule `inference` runs), in a working directory of its own: write_job_config() writes the config from
keyword settings (each to its section: generation or server), job_cmd() the command line, and
JobFiles the dataset's files (results/D/journal.jsonl, ...)."""

import json
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
RUN = [sys.executable, str(REPO / "scripts" / "run_inference.py")]

GENERATION_KEYS = {"token_budget", "max_tokens", "concurrency", "temperature", "top_p", "seed", "extra_body", "turns",
                   "history_reasoning", "samples_per_prompt", "on_settings_change",
                   "on_bad_line", "thinking_budget", "quality"}


class JobFiles:
    def __init__(self, workdir, dataset="d"):
        base = Path(workdir) / "results" / dataset
        self.journal = base / "journal.jsonl"
        self.errors = base / "errors.jsonl"
        self.done = base / "inference.done"
        self.raw = base / "raw_responses.jsonl"
        self.lock = base / "journal.jsonl.lock"
        self.server_log = Path(workdir) / "logs" / "server" / f"{dataset}.log"

    def records(self, name="journal"):
        path = getattr(self, name)
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def write_job_config(workdir, base_url=None, dataset="d", prompts=None, budget=10**6, model="mock-model",
                     tokenizer="unused", **settings):
    """config.yaml in workdir for one dataset (prompts: workdir/prompts.jsonl unless given); settings go
    to `generation` or `server` by name."""
    prompts = prompts if prompts is not None else Path(workdir) / "prompts.jsonl"
    server = {"model": model, "startup_wait_s": 2}
    if base_url is not None:
        server["base_url"] = base_url
    generation = {"token_budget": budget}
    for key, value in settings.items():
        (generation if key in GENERATION_KEYS else server)[key] = value
    config = {"server": server, "generation": generation, "tokenizer": {"path": str(tokenizer)},
              "datasets": {dataset: {"prompts": str(prompts)}}}
    path = Path(workdir) / "config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def job_cmd(workdir, base_url=None, dataset="d", **settings):
    """The command line of the job in workdir (--directory); writes the config first."""
    settings.setdefault("progress_interval_s", 0.5)
    path = write_job_config(workdir, base_url, dataset=dataset, **settings)
    return RUN + ["--directory", str(workdir), "--config", str(path), "--dataset", dataset]
