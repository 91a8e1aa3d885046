#!/usr/bin/env python3
"""Write the budget status of one dataset (checkpoint `budget_status`): tokens and responses in
its journal, prompts left, exhausted or not. Whether the budget is met is decided against the
config's budget at DAG time, so the budget is deliberately not an input here."""

import argparse

from budgetgen.conversations import TURNS, Plan
from budgetgen.errors import entry_point
from budgetgen.fsutil import write_json_atomic
from budgetgen.settings import generation_plan
from budgetgen.status import compute_status


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dataset", required=True)
    ap.add_argument("--journal", required=True)
    ap.add_argument("--errors", required=True)
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--on-bad-line", choices=["error", "skip"], default="error")
    ap.add_argument("--turns", choices=TURNS, default="last", help="generation.turns (default %(default)s)")
    ap.add_argument("--samples-per-prompt", type=int, default=1, help="generation.samples_per_prompt (default 1)")
    ap.add_argument("--output", required=True)
    a = ap.parse_args(argv)
    if a.samples_per_prompt < 1:
        ap.error("--samples-per-prompt must be at least 1")
    plan = Plan(turns=a.turns, samples=a.samples_per_prompt)
    status = compute_status(a.dataset, a.journal, a.errors, a.prompts, a.on_bad_line, plan)
    write_json_atomic(a.output, status)
    print(f"{a.dataset}: {status['tokens']} tokens in {status['responses']} responses, "
          f"{status['remaining_prompts']} generations left ({status['conversations']} conversations of "
          f"{status['prompts']} prompts)")
    return 0


def argv_from_snakemake(smk):
    p = smk.params
    # the plan from the config, not a param: a changed plan never reruns the checkpoint (the status
    # records the plan it counted under, and budgetgen.state does not trust it under another one)
    plan = generation_plan(smk.config, smk.wildcards.dataset)
    return ["--dataset", smk.wildcards.dataset, "--journal", p.journal, "--errors", p.errors,
            "--prompts", p.prompts, "--on-bad-line", p.on_bad_line, "--turns", plan.turns,
            "--samples-per-prompt", str(plan.samples), "--output", smk.output[0]]


if __name__ == "__main__":
    entry_point(main, argv_from_snakemake, globals())
