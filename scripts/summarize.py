#!/usr/bin/env python3
"""Write results/summary.tsv (rule `summary`): one row per dataset."""

import argparse

from budgetgen.conversations import TURNS, Plan
from budgetgen.errors import UserError, entry_point
from budgetgen.fsutil import atomic_output
from budgetgen.settings import generation_plan
from budgetgen.summary import dataset_row, format_tsv


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dataset", nargs=6, action="append", required=True,
                    metavar=("NAME", "RAW", "TOKENIZED", "BUDGET", "PROMPTS", "ERRORS"),
                    help="one dataset; repeat for each")
    ap.add_argument("--plan", nargs=3, action="append", default=[], metavar=("NAME", "TURNS", "SAMPLES"),
                    help="a dataset's generation.turns and samples_per_prompt (default: last 1)")
    ap.add_argument("--output", required=True)
    a = ap.parse_args(argv)
    plans = {}
    for name, turns, samples in a.plan:
        if turns not in TURNS or not samples.isdigit() or int(samples) < 1:
            raise UserError(f"--plan {name}: turns must be one of {', '.join(TURNS)} and samples a positive integer")
        plans[name] = Plan(turns=turns, samples=int(samples))
    rows = []
    for name, raw, tokenized, budget, prompts, errors in a.dataset:
        try:
            budget = int(budget)
        except ValueError:
            raise UserError(f"--dataset {name}: budget {budget!r} is not an integer") from None
        rows.append(dataset_row(name, raw, budget, prompts, errors, tokenized, plans.get(name)))
    text = format_tsv(rows)
    with atomic_output(a.output) as f:
        f.write(text)
    print(text, end="")
    return 0


def argv_from_snakemake(smk):
    argv = ["--output", smk.output[0]]
    p = smk.params
    for i, name in enumerate(p.datasets):
        argv += ["--dataset", name, smk.input.raw[i], smk.input.tokenized[i], p.budgets[i], p.prompts[i], p.errors[i]]
        plan = generation_plan(smk.config, name)
        argv += ["--plan", name, plan.turns, str(plan.samples)]
    return argv


if __name__ == "__main__":
    entry_point(main, argv_from_snakemake, globals())
