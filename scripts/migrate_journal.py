#!/usr/bin/env python3
"""Migrate a dataset's journal written before generation identities, once (budgetgen.migration).

Every record of results/D/journal.jsonl and results/D/errors.jsonl that has no "identity" is stamped
with the identity its params imply (records with a `sample` field: the config's samples_per_prompt);
nothing is regenerated. Holds the journal's lock (never beside a running inference job); each file is
replaced atomically (a kill leaves the old file or the whole new one); a second run changes nothing.
Every other reader refuses such records in one line naming this command.

    python scripts/migrate_journal.py --config config.yaml --dataset D [-d DIR]
"""

import argparse

from budgetgen.configfile import add_dataset_arguments, dataset_config, declared_files
from budgetgen.entry import run_main
from budgetgen.migration import migrate_dataset
from budgetgen.settings import InferenceSettings


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_dataset_arguments(ap)
    a = ap.parse_args(argv)
    s = InferenceSettings.from_config(dataset_config(a), a.dataset, files=declared_files(a))
    for path, (stamped, records) in migrate_dataset(s.paths, s.plan.samples).items():
        print(f"{path}: {stamped} of {records} records stamped with their identity"
              + ("" if stamped else " (nothing to do)"))
    return 0


if __name__ == "__main__":
    run_main(main)
