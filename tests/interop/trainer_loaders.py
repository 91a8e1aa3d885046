"""Run INSIDE a trainer's venv by tests/interop/test_trainers.py (never imported by budgetgen's own
tests): load a pre-tokenized JSONL with the trainer's own data-preparation code and write the rows it
produced as JSON Lines (`{"input_ids": [...], "loss_mask": [...]}`) plus one header line describing
what was called.

    python trainer_loaders.py specforge JSONL MAX_LENGTH OUT
    python trainer_loaders.py speculators-fn JSONL MAX_LENGTH OUT TOKENIZER
    python trainer_loaders.py speculators-cli JSONL MAX_LENGTH OUT TOKENIZER
"""

import json
import os
import subprocess
import sys
import tempfile
from importlib.metadata import version


def specforge(path, max_length):
    # The function SpecForge's online runs call for data.prompts_path / data.train_data_path
    # (specforge/training/assembly.py: _prepare_prompts); the config model is validated first.
    from specforge.config.schema import DataConfig
    from specforge.data.prompt_builder import prepare_prompt_tasks

    DataConfig(prompts_path=path, max_length=max_length)
    tasks = prepare_prompt_tasks(path, None, chat_template=None, max_length=max_length, is_preformatted=False,
                                 train_only_last_turn=False, cache_dir=None, cache_key=None, num_proc=1)
    rows = [t["payload"] for t in tasks]
    return {"trainer": "specforge", "version": version("specforge"),
            "called": "specforge.data.prompt_builder.prepare_prompt_tasks"}, rows


def _torch_rows(ds):
    rows, dtypes = [], set()
    for r in ds:
        dtypes.add(str(r["input_ids"].dtype))
        dtypes.add(str(r["loss_mask"].dtype))
        rows.append({"input_ids": r["input_ids"].tolist(), "loss_mask": r["loss_mask"].tolist()})
    return rows, sorted(dtypes)


def speculators_fn(path, max_length, tokenizer):
    # load_raw_dataset + build_speculator_training_dataset: what load_and_preprocess_dataset (and so
    # `speculators prepare-data`) runs per --data path, without its seeded shuffle, so order is kept.
    from speculators.data_generation.preprocessing import (
        build_speculator_training_dataset,
        load_processor,
        load_raw_dataset,
    )

    raw, _ = load_raw_dataset(path)
    out = build_speculator_training_dataset(raw, load_processor(tokenizer), max_length=max_length, num_proc=1)
    rows, dtypes = _torch_rows(out)
    return {"trainer": "speculators", "version": version("speculators"), "dtypes": dtypes,
            "columns": out.column_names,
            "called": "speculators.data_generation.preprocessing.build_speculator_training_dataset"}, rows


def speculators_cli(path, max_length, tokenizer):
    # The documented command; its output folder is what `speculators train` reads.
    from datasets import load_from_disk

    out_dir = os.path.join(tempfile.mkdtemp(prefix="prepared-"), "out")
    cli = os.path.join(os.path.dirname(sys.executable), "speculators")
    subprocess.run([cli, "prepare-data", "--model", tokenizer, "--data", path, "--output", out_dir,
                    "--seq-length", str(max_length), "--num-preprocessing-workers", "1"], check=True)
    ds = load_from_disk(out_dir)
    ds.set_format(type="torch")
    rows, dtypes = _torch_rows(ds)
    return {"trainer": "speculators", "version": version("speculators"), "dtypes": dtypes,
            "columns": ds.column_names, "called": "speculators prepare-data"}, rows


def main(argv):
    mode, path, max_length, out = argv[:4]
    max_length = int(max_length)
    if mode == "specforge":
        header, rows = specforge(path, max_length)
    elif mode == "speculators-fn":
        header, rows = speculators_fn(path, max_length, argv[4])
    elif mode == "speculators-cli":
        header, rows = speculators_cli(path, max_length, argv[4])
    else:
        raise SystemExit(f"unknown mode {mode}")
    with open(out, "w") as f:
        f.write(json.dumps(header) + "\n")
        for r in rows:
            f.write(json.dumps({"input_ids": list(r["input_ids"]), "loss_mask": list(r["loss_mask"])}) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
