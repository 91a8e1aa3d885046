#!/usr/bin/env python3
"""Make a dataset's training rows (rule `tokenize`): results/D/raw_responses.jsonl -> results/D/tokenized.arrow.

    python scripts/tokenize_responses.py --config config.yaml --dataset D [-d DIR] [--processes N]

A row is the prompt ids + the completion ids, loss_mask 1 on the completion (see
budgetgen/tokenization.py). Every setting comes from the config's `tokenizer` section (validated, the
schema's defaults filled in); the output is an Arrow IPC stream (datasets.Dataset.from_file reads it).
Named so as not to shadow the stdlib `tokenize` module.
"""

import argparse

from budgetgen.errors import UserError, entry_point
from budgetgen.settings import TokenizeSettings, add_dataset_arguments, dataset_config


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_dataset_arguments(ap)
    ap.add_argument("--processes", type=int, default=None,
                    help="the threads Snakemake granted the job (default: tokenizer.processes)")
    return ap.parse_args(argv)


def main(argv=None, config=None):
    a = parse_args(argv)
    config = dataset_config(a, config)
    if a.processes is not None and a.processes < 1:
        raise UserError(f"--processes must be at least 1, got {a.processes}")
    s = TokenizeSettings.from_config(config, a.dataset, processes=a.processes)
    from budgetgen.tokenization import tokenize_file

    tokenize_file(s.paths.raw_responses, s.paths.tokenized, s.tokenizer, s.max_length, processes=s.processes,
                  chat_template_kwargs=s.chat_template_kwargs,
                  # on_settings_change: extend keeps the records of earlier settings: each row says its own
                  allow_mixed_settings=s.allow_mixed_settings or s.policy.on_change == "extend",
                  samples=s.samples,
                  use_server_token_ids=s.use_server_token_ids, config_sha256=s.config_sha256,
                  trust_remote_code=s.trust_remote_code, max_skipped_pct=s.max_skipped_pct,
                  reasoning_tags=s.reasoning_tags, log=lambda msg: print(msg, flush=True))
    return 0


def argv_from_snakemake(smk):
    """Rule `tokenize`: the dataset and the threads Snakemake granted; the config is Snakemake's own."""
    return ["--config", "(the config Snakemake loaded)", "--dataset", smk.wildcards.dataset,
            "--processes", smk.threads]


if __name__ == "__main__":
    entry_point(main, argv_from_snakemake, globals(), config_from_snakemake=True)
