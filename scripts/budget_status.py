#!/usr/bin/env python3
"""Write the budget status of one dataset (checkpoint `budget_status`): tokens and responses in its
journal of the generation identities that count, generations left, exhausted or not, a settings change
to refuse (budgetgen.status). Whether the budget is met is decided against the config's budget at DAG
time, so the budget is deliberately not an input here.

    python scripts/budget_status.py --config config.yaml --dataset D [-d DIR]
"""

import argparse

from budgetgen.configfile import add_dataset_arguments, dataset_config, declared_files, snakemake_paths
from budgetgen.entry import entry_point
from budgetgen.fsutil import write_json_atomic
from budgetgen.settings import InferenceSettings
from budgetgen.status import compute_status


def main(argv=None, config=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_dataset_arguments(ap)
    a = ap.parse_args(argv)
    config = dataset_config(a, config)
    s = InferenceSettings.from_config(config, a.dataset, files=declared_files(a))
    status = compute_status(s)
    write_json_atomic(s.paths.status, status)
    print(f"{a.dataset}: {status['tokens']} tokens in {status['responses']} responses, "
          f"{status['remaining_prompts']} generations left ({status['conversations']} conversations of "
          f"{status['prompts']} prompts)" + (f"; {status['refused']}" if status["refused"] else ""))
    return 0


def argv_from_snakemake(smk):
    """Checkpoint `budget_status`: the dataset; the config is Snakemake's own. The identity comes from
    the config, not a param: a settings change never reruns the checkpoint (the status records what it
    counted under, and budgetgen.state does not trust it under other settings)."""
    return ["--config", "(the config Snakemake loaded)", "--dataset", smk.wildcards.dataset,
            *snakemake_paths(smk.input, smk.output)]


if __name__ == "__main__":
    entry_point(main, argv_from_snakemake, globals(), config_from_snakemake=True)
