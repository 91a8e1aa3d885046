#!/usr/bin/env python3
"""Write results/summary.tsv (rule `summary`): one row per dataset of the config.

    python scripts/summarize.py --config config.yaml [-d DIR] --output results/summary.tsv

Each dataset's paths, budget, generation plan and identity come from the config (budgetgen.settings):
errors count only under the generation identities that count (budgetgen.identity). A dataset of several
lanes (mixture cells, a validation split: budgetgen.mixture) is followed by a row per lane.
"""

import argparse
import os

from budgetgen import prompts
from budgetgen.configfile import load_config
from budgetgen.entry import entry_point
from budgetgen.fsutil import atomic_output
from budgetgen.mixture import VALIDATION
from budgetgen.settings import InferenceSettings
from budgetgen.summary import (
    add_rows_and_forecast,
    dataset_row,
    format_tsv,
    lane_rows,
    mixture_status,
    read_raw,
    row_tokens_by_cell,
)


def cross_dataset_duplicates(settings):
    """{dataset: how many of its prompts (by normalised content) another dataset of the config has too}."""
    keys = {name: prompts.content_keys(prompts.load_prompts(s.paths.prompts, on_bad_line="skip").prompts)
            for name, s in settings.items()}
    return {name: len(mine & set().union(*(k for other, k in keys.items() if other != name)))
            for name, mine in keys.items()}


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
    all_settings = {name: InferenceSettings.from_config(config, name) for name in sorted(config["datasets"])}
    shared = cross_dataset_duplicates(all_settings)
    for name, s in all_settings.items():
        # read once: the dataset's row and its lanes', each record's fate under its cell's quality gate
        raw = read_raw(s.paths.raw_responses, [(c.name, c.gate) for c in s.mixture.cells], s.reasoning_tags)
        row = dataset_row(name, raw, s.budget, s.paths.prompts, s.paths.errors,
                          s.paths.tokenized, s.plan, s.policy.accepts)
        tokenized = row_tokens_by_cell(s.paths.tokenized)
        validation = row_tokens_by_cell(s.paths.validation) if s.mixture.validation_share > 0 else {}
        add_rows_and_forecast(row, tokenized, validation, s.forecast)
        row["cross_dataset_duplicates"] = shared[name]
        if s.mixture.plain:
            rows.append(row)
            continue
        st, lanes, row["status"] = mixture_status(s)
        for lane_obj in s.mixture.lanes:  # the lanes as objects: cell, split and share are theirs
            held = st["lanes"].get(lane_obj.key) or {}
            split_share = (s.mixture.validation_share if lane_obj.split == VALIDATION
                           else 1 - s.mixture.validation_share)
            lanes[lane_obj.key].update(cell=lane_obj.cell.name, split=lane_obj.split, prompts=held.get("prompts", ""),
                                       errors=held.get("errors", 0), budget_share=lane_obj.cell.share * split_share)
        rows += [row] + lane_rows(name, raw, lanes, tokenized, validation, s.forecast)
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
