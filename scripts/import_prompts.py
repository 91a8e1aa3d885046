#!/usr/bin/env python3
"""Convert a Hugging Face `datasets` source into prompts.jsonl (rule `import_prompts`).

    python scripts/import_prompts.py --source data/b4.parquet --output results/B4/prompts.jsonl
        [--format parquet|arrow|json|csv|disk] [--split train] [--columns '{"prompt": "question"}']
        [--no-validate]

The source is read with datasets.load_dataset (or load_from_disk for a save_to_disk folder);
--columns maps budgetgen's fields (id, messages, conversations, prompt, instruction, input, system)
to source column names. Rows are checked as prompts unless --no-validate (on_bad_line: skip, where
bad rows are skipped and counted downstream instead).
"""

import argparse
import json

from budgetgen.entry import entry_point
from budgetgen.errors import UserError


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source", required=True, help="data file or folder")
    ap.add_argument("--output", required=True, help="prompts.jsonl to write (atomically)")
    ap.add_argument("--format", default=None, help="datasets builder (default: from the extension)")
    ap.add_argument("--split", default="train")
    ap.add_argument("--columns", default="{}", metavar="JSON", help="budgetgen field -> source column")
    ap.add_argument("--no-validate", action="store_true", help="do not check rows as prompts here")
    a = ap.parse_args(argv)
    try:
        columns = json.loads(a.columns)
    except ValueError as exc:
        raise UserError(f"--columns: not valid JSON ({exc})") from None
    if not isinstance(columns, dict) or not all(isinstance(v, str) for v in columns.values()):
        raise UserError("--columns: must be a JSON object of field -> column name")
    from budgetgen.sources import import_prompts

    n = import_prompts(a.source, a.output, a.format, a.split, columns, validate=not a.no_validate)
    print(f"Imported {n} rows from {a.source} into {a.output}", flush=True)
    return 0


def argv_from_snakemake(smk):
    p = smk.params
    argv = ["--source", smk.input.source, "--output", smk.output[0], "--split", p.split, "--columns", p.columns]
    if p.format:
        argv += ["--format", p.format]
    return argv + (["--no-validate"] if p.on_bad_line == "skip" else [])


if __name__ == "__main__":
    entry_point(main, argv_from_snakemake, globals())
