#!/usr/bin/env python3
"""Copy a dataset's journal to raw_responses.jsonl (rule `finalize`): whole records only, of the
generation identities that count (budgetgen.identity: the settings now, and
generation.on_settings_change), the first record of each id, in journal order, streamed (a journal can
be GBs), written atomically. Each record says its mixture cell and split as they are now
(budgetgen.mixture: the split is a function of the prompt; tokenize writes each split's rows to its own
file).

    python scripts/finalize.py --config config.yaml --dataset D [-d DIR]
"""

import argparse

from budgetgen import journal
from budgetgen.configfile import add_dataset_arguments, dataset_config, declared_files, snakemake_paths
from budgetgen.entry import entry_point
from budgetgen.fsutil import atomic_output
from budgetgen.identity import record_sha
from budgetgen.settings import InferenceSettings


def main(argv=None, config=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_dataset_arguments(ap)
    a = ap.parse_args(argv)
    s = InferenceSettings.from_config(dataset_config(a, config), a.dataset, files=declared_files(a))
    mix = s.mixture
    place = mix.placer(s.policy, s.load_prompts().prompts if mix.validation_share > 0 else None)
    tokens = count = 0
    per_split = {}
    with atomic_output(s.paths.raw_responses) as f:
        for lineno, rec in journal.iter_records(s.paths.journal, accepts=s.policy.accepts):
            named = rec.get("cell") if isinstance(rec.get("cell"), str) else None
            rec["cell"], rec["split"] = place(record_sha(rec, f"{s.paths.journal}:{lineno}"), str(rec["id"]), named)
            f.write(journal.encode_record(rec))
            tokens += int((rec.get("usage") or {}).get("completion_tokens") or 0)
            count += 1
            per_split[rec["split"]] = per_split.get(rec["split"], 0) + 1
    splits = "" if len(mix.splits) == 1 else " (" + ", ".join(f"{k} {v}" for k, v in sorted(per_split.items())) + ")"
    print(f"Finalized: {count} responses{splits}, {tokens} completion tokens -> {s.paths.raw_responses}")
    return 0


def argv_from_snakemake(smk):
    """Rule `finalize`: the dataset and its declared files; the config is Snakemake's own."""
    return ["--config", "(the config Snakemake loaded)", "--dataset", smk.wildcards.dataset,
            *snakemake_paths(smk.input, smk.output)]


if __name__ == "__main__":
    entry_point(main, argv_from_snakemake, globals(), config_from_snakemake=True)
