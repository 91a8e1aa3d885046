#!/usr/bin/env python3
"""Write the budget status of one dataset (checkpoint `budget_status`): tokens and responses in
its journal, prompts left, exhausted or not. Whether the budget is met is decided against the
config's budget at DAG time, so the budget is deliberately not an input here."""

import argparse

from budgetgen.errors import entry_point
from budgetgen.fsutil import write_json_atomic
from budgetgen.status import compute_status


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dataset", required=True)
    ap.add_argument("--journal", required=True)
    ap.add_argument("--errors", required=True)
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--on-bad-line", choices=["error", "skip"], default="error")
    ap.add_argument("--output", required=True)
    a = ap.parse_args(argv)
    status = compute_status(a.dataset, a.journal, a.errors, a.prompts, a.on_bad_line)
    write_json_atomic(a.output, status)
    print(f"{a.dataset}: {status['tokens']} tokens in {status['responses']} responses, "
          f"{status['remaining_prompts']} of {status['prompts']} prompts left")
    return 0


def argv_from_snakemake(smk):
    p = smk.params
    return ["--dataset", smk.wildcards.dataset, "--journal", p.journal, "--errors", p.errors,
            "--prompts", p.prompts, "--on-bad-line", p.on_bad_line, "--output", smk.output[0]]


if __name__ == "__main__":
    entry_point(main, argv_from_snakemake, globals())
