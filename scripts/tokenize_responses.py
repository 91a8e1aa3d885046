#!/usr/bin/env python3
"""Make a dataset's training rows (rule `tokenize`): results/D/raw_responses.jsonl -> results/D/tokenized.arrow,
and (rule `tokenize_validation`, a dataset with a validation split) its validation rows -> results/D/validation.arrow.

    python scripts/tokenize_responses.py --config config.yaml --dataset D [-d DIR] [--processes N] [--split S]

A row is the prompt ids + the completion ids, loss_mask 1 on the completion (see
budgetgen/tokenization.py). Every setting comes from the config's `tokenizer` section (validated, the
schema's defaults filled in); the output is an Arrow IPC stream (datasets.Dataset.from_file reads it).
Named so as not to shadow the stdlib `tokenize` module.
"""

import argparse

from budgetgen.configfile import add_dataset_arguments, dataset_config, declared_files, snakemake_paths
from budgetgen.entry import entry_point
from budgetgen.errors import UserError
from budgetgen.settings import TokenizeSettings


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_dataset_arguments(ap)
    ap.add_argument("--processes", type=int, default=None,
                    help="the threads Snakemake granted the job (default: tokenizer.processes)")
    ap.add_argument("--split", choices=("train", "validation"), default="train",
                    help="the records of which split: train -> tokenized.arrow, validation -> validation.arrow "
                         "(datasets.D.validation or generation.validation; default: train)")
    return ap.parse_args(argv)


def main(argv=None, config=None):
    a = parse_args(argv)
    config = dataset_config(a, config)
    if a.processes is not None and a.processes < 1:
        raise UserError(f"--processes must be at least 1, got {a.processes}")
    s = TokenizeSettings.from_config(config, a.dataset, processes=a.processes, files=declared_files(a))
    from budgetgen.tokenization import tokenize_file

    if a.split == "validation" and not s.validation:
        raise UserError(f"--split validation: dataset {a.dataset} has no validation split (set validation.share)")
    out = s.paths.validation if a.split == "validation" else s.paths.tokenized
    tokenize_file(s.paths.raw_responses, out, s.options(a.split), log=lambda msg: print(msg, flush=True))
    return 0


def argv_from_snakemake(smk):
    """Rules `tokenize` and `tokenize_validation`: the dataset, the split and the threads Snakemake granted;
    the config is Snakemake's own."""
    return ["--config", "(the config Snakemake loaded)", "--dataset", smk.wildcards.dataset,
            "--processes", smk.threads, "--split", smk.params.split, *snakemake_paths(smk.input, smk.output)]


if __name__ == "__main__":
    entry_point(main, argv_from_snakemake, globals(), config_from_snakemake=True)
