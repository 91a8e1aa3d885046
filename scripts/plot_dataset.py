#!/usr/bin/env python3
"""Draw one dataset's report figures (rule `plots`) from its raw_responses.jsonl: budget bar,
completion-length histogram with the share cut at max_tokens, reasoning vs answer tokens,
errors, throughput over the run, turns, and the quality gate's kept and dropped tokens per cell
(budgetgen.quality). The format of each figure is its extension (.svg, .png)."""

import argparse
import json
import os

from budgetgen import plots
from budgetgen.conversations import TURNS, Plan
from budgetgen.entry import entry_point
from budgetgen.errors import UserError
from budgetgen.quality import Gate
from budgetgen.settings import InferenceSettings, generation_plan
from budgetgen.summary import dataset_row, mixture_status, read_raw


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dataset", required=True, help="dataset name (figure titles)")
    ap.add_argument("--raw", required=True, help="results/D/raw_responses.jsonl")
    ap.add_argument("--prompts", required=True, help="the dataset's prompts file (for the state)")
    ap.add_argument("--errors", required=True, help="results/D/errors.jsonl (may not exist)")
    ap.add_argument("--budget", type=int, required=True, help="token budget in completion tokens")
    ap.add_argument("--max-tokens", type=int, required=True, help="the max_tokens of the requests")
    ap.add_argument("--state", choices=("met", "exhausted", "partial"), default=None,
                    help="the dataset's state for the budget figure (a mixture's, every lane's: the rule passes "
                         "summary.tsv's); default: from the records, as summary.tsv's row of a one-lane dataset")
    ap.add_argument("--turns", choices=TURNS, default="last", help="generation.turns (default %(default)s)")
    ap.add_argument("--samples-per-prompt", type=int, default=1, help="generation.samples_per_prompt (default 1)")
    ap.add_argument("--quality", metavar="JSON", default=None,
                    help='the cells\' quality gates, [[cell, {"truncated": "drop", ...}], ...] (default: keep all)')
    ap.add_argument("--reasoning-tags", nargs=2, metavar=("OPEN", "CLOSE"), default=None,
                    help="tokenizer.reasoning_tags (default <think> </think>)")
    for name in plots.FIGURES:
        ap.add_argument(f"--{name}-figure", metavar="PATH", help=f"write the {name} figure here")
    a = ap.parse_args(argv)
    wanted = {name: getattr(a, f"{name}_figure") for name in plots.FIGURES if getattr(a, f"{name}_figure")}
    if not wanted:
        ap.error("give at least one --NAME-figure PATH")
    for path in wanted.values():
        if os.path.splitext(path)[1].lower() not in (".svg", ".png"):
            raise UserError(f"{path}: figure format must be .svg or .png")
    if not os.path.exists(a.raw):
        raise UserError(f"{a.raw}: raw responses not found")
    records = plots.load_records(a.raw)
    error_records = plots.load_records(a.errors)
    if a.samples_per_prompt < 1:
        ap.error("--samples-per-prompt must be at least 1")
    gates = [(cell, Gate.of(g)) for cell, g in json.loads(a.quality)] if a.quality else []
    raw = read_raw(a.raw, gates, tuple(a.reasoning_tags) if a.reasoning_tags else None)
    row = dataset_row(a.dataset, raw, a.budget, a.prompts, a.errors,
                      plan=Plan(turns=a.turns, samples=a.samples_per_prompt))
    if a.state:
        row["status"] = a.state
    for name, path in wanted.items():
        plots.save(plots.draw(name, a.dataset, records, error_records, row, a.max_tokens, raw), path)
        print(f"{name} figure -> {path}")
    return 0


def argv_from_snakemake(smk):
    argv = ["--dataset", smk.wildcards.dataset, "--raw", smk.input.raw, "--prompts", smk.input.prompts,
            "--errors", smk.params.errors, "--budget", smk.params.budget, "--max-tokens", smk.params.max_tokens]
    plan = generation_plan(smk.config, smk.wildcards.dataset)
    argv += ["--turns", plan.turns, "--samples-per-prompt", str(plan.samples)]
    s = InferenceSettings.from_config(smk.config, smk.wildcards.dataset)
    argv += ["--quality", json.dumps([[c.name, c.gate.describe()] for c in s.mixture.cells])]
    if s.reasoning_tags:
        argv += ["--reasoning-tags", *s.reasoning_tags]
    if not s.mixture.plain:
        argv += ["--state", mixture_status(s)[2]]
    for name in plots.FIGURES:
        argv += [f"--{name}-figure", smk.output[name]]
    return argv


if __name__ == "__main__":
    entry_point(main, argv_from_snakemake, globals())
