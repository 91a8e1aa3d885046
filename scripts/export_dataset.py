#!/usr/bin/env python3
"""Export one dataset for draft-model training (rule `export`, target `export`).

    python scripts/export_dataset.py --raw results/D/raw_responses.jsonl --tokenized results/D/tokenized.arrow
        --specforge results/D/export/specforge.jsonl --pretokenized results/D/export/pretokenized.jsonl
        --hf-dataset results/D/export/hf_dataset

--specforge: SpecForge's conversations JSONL; --pretokenized: the tokenized rows as JSON Lines
{"id", "input_ids", "loss_mask"}, read as they are by SpecForge (data.prompts_path) and speculators
(`speculators prepare-data --data FILE`); --hf-dataset: a datasets save_to_disk folder of the
pre-tokenized rows (id, input_ids, loss_mask, attention_mask). See budgetgen/export.py.
"""

import argparse

from budgetgen.entry import entry_point


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--raw", required=True, help="raw_responses.jsonl")
    ap.add_argument("--tokenized", required=True, help="tokenized.arrow")
    ap.add_argument("--specforge", required=True, help="SpecForge conversations JSONL to write")
    ap.add_argument("--pretokenized", required=True,
                    help="pre-tokenized JSONL to write (SpecForge data.prompts_path, speculators prepare-data)")
    ap.add_argument("--hf-dataset", required=True, help="save_to_disk folder to write")
    ap.add_argument("--split", choices=("train", "validation"), default="train",
                    help="the raw records of which split go to --specforge (--tokenized is that split's rows: "
                         "tokenized.arrow or validation.arrow; default: train)")
    a = ap.parse_args(argv)
    from budgetgen.export import to_hf_dataset, to_pretokenized_jsonl, to_specforge

    n = to_specforge(a.raw, a.specforge, split=a.split)
    rows = to_pretokenized_jsonl(a.tokenized, a.pretokenized)
    hf_rows = to_hf_dataset(a.tokenized, a.hf_dataset)
    print(f"Exported {n} conversations to {a.specforge}, {rows} pre-tokenized rows to {a.pretokenized} "
          f"and {hf_rows} to {a.hf_dataset}", flush=True)
    return 0


def argv_from_snakemake(smk):
    return ["--raw", smk.input.raw, "--tokenized", smk.input.tokenized, "--specforge", smk.output.specforge,
            "--pretokenized", smk.output.pretokenized, "--hf-dataset", smk.output.hf_dataset,
            "--split", smk.params.split]


if __name__ == "__main__":
    entry_point(main, argv_from_snakemake, globals())
