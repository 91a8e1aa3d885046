#!/usr/bin/env python3
"""Write results/summary.tsv (rule `summary`): one row per dataset of the config.

    python scripts/summarize.py --config config.yaml [-d DIR] --output results/summary.tsv

Each dataset's paths, budget, generation plan and identity come from the config (budgetgen.settings):
errors count only under the generation identities that count (budgetgen.identity).
"""

import argparse
import os

from budgetgen.errors import entry_point
from budgetgen.fsutil import atomic_output
from budgetgen.settings import InferenceSettings, load_config
from budgetgen.summary import dataset_row, format_tsv


def main(argv=None, config=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True, help="the workflow's config file (config.yaml)")
    ap.add_argument("--directory", "-d", default=None, help="working directory (default: the current one)")
    ap.add_argument("--output", required=True)
    a = ap.parse_args(argv)
    config = config if config is not None else load_config(os.path.abspath(a.config))
    if a.directory:
        os.chdir(a.directory)
    rows = []
    for name in sorted(config["datasets"]):
        s = InferenceSettings.from_config(config, name)
        rows.append(dataset_row(name, s.paths.raw_responses, s.budget, s.paths.prompts, s.paths.errors,
                                s.paths.tokenized, s.plan, s.policy.accepts))
    text = format_tsv(rows)
    with atomic_output(a.output) as f:
        f.write(text)
    print(text, end="")
    return 0


def argv_from_snakemake(smk):
    """Rule `summary`: the output; the config is Snakemake's own."""
    return ["--config", "(the config Snakemake loaded)", "--output", smk.output[0]]


if __name__ == "__main__":
    entry_point(main, argv_from_snakemake, globals(), config_from_snakemake=True)
