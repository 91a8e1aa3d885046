#!/usr/bin/env python3
"""Copy a dataset's journal to raw_responses.jsonl: whole records only, the first record of each
id, in journal order, streamed (a journal can be GBs), written atomically."""

import argparse

from budgetgen import journal
from budgetgen.errors import entry_point
from budgetgen.fsutil import atomic_output


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--journal", required=True)
    ap.add_argument("--output", required=True)
    a = ap.parse_args(argv)
    tokens = count = 0
    with atomic_output(a.output) as f:
        for _, rec in journal.iter_records(a.journal):
            f.write(journal.encode_record(rec))
            tokens += int((rec.get("usage") or {}).get("completion_tokens") or 0)
            count += 1
    print(f"Finalized: {count} responses, {tokens} completion tokens -> {a.output}")
    return 0


def argv_from_snakemake(smk):
    return ["--journal", smk.params.journal, "--output", smk.output[0]]


if __name__ == "__main__":
    entry_point(main, argv_from_snakemake, globals())
