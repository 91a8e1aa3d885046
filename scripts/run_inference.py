#!/usr/bin/env python3
"""Generate responses for one dataset up to its token budget (rule `inference`).

    python scripts/run_inference.py --config config.yaml --dataset D [--server-slots N]

Every setting comes from the config (validated, the schema's defaults filled in; see
budgetgen.settings): the dataset's prompts, budget and generation settings, the server. Paths are
relative to the working directory (results/D/journal.jsonl, ...). Appends each response to the
journal as it arrives; resumable at any point; writes results/D/inference.done (atomically) only
when the budget is met or the prompts are exhausted.
"""

import argparse
import logging
import sys

from budgetgen.configfile import add_dataset_arguments, dataset_config, declared_files, snakemake_paths
from budgetgen.entry import entry_point
from budgetgen.inference import run
from budgetgen.settings import InferenceSettings, generation_setting


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_dataset_arguments(ap)
    ap.add_argument("--server-slots", type=int, default=None,
                    help="the server_slots Snakemake granted this job (--resources server_slots=N caps it); "
                         "in flight = the lower of it and the dataset's concurrency, said at start")
    return ap.parse_args(argv)


def setup_logging():
    """Timestamped lines on stdout (the rule's log under Snakemake), from every budgetgen logger."""
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%Y-%m-%d %H:%M:%S"))
    logger = logging.getLogger("budgetgen")
    logger.handlers[:] = [handler]
    logger.setLevel(logging.INFO)
    logger.propagate = False


def main(argv=None, config=None):
    a = parse_args(argv)
    setup_logging()
    config = dataset_config(a, config)
    settings = InferenceSettings.from_config(config, a.dataset, slots=a.server_slots, files=declared_files(a))
    configured = int(generation_setting(config, a.dataset, "concurrency"))
    if settings.concurrency < configured:
        logging.getLogger("budgetgen.inference").info(
            f"concurrency {configured} (generation.concurrency) capped to {settings.concurrency} by Snakemake's "
            "server_slots resource (--resources server_slots=N, e.g. from a profile): raise or drop it to "
            "honour the configured concurrency")
    return run(settings)


def argv_from_snakemake(smk):
    """Rule `inference`: the dataset and the slots Snakemake granted; the config is Snakemake's own."""
    return ["--config", "(the config Snakemake loaded)", "--dataset", smk.wildcards.dataset,
            "--server-slots", smk.resources.server_slots, *snakemake_paths(smk.input, smk.output)]


if __name__ == "__main__":
    entry_point(main, argv_from_snakemake, globals(), config_from_snakemake=True)
