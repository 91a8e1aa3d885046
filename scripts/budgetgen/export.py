"""Export a dataset to the layouts draft-model trainers read.

- SpecForge (sgl-project/SpecForge): JSON Lines of {"id", "conversations": [{"role", "content"}]},
  which its data pipeline tokenizes with its own chat template. The generated turn keeps its
  `reasoning_content` beside `content`, for templates that render it.
- Pre-tokenized (speculators and any HF-datasets trainer): `datasets.Dataset.save_to_disk` of
  tokenized.arrow, columns id, input_ids, loss_mask (as budgetgen wrote them) plus attention_mask;
  `datasets.load_from_disk(folder)` reads it back.
Both appear atomically (written under a temporary name, then renamed).
"""

import json
import os
import shutil

from budgetgen.errors import UserError
from budgetgen.fsutil import atomic_output


def to_specforge(raw_path, out_path):
    """raw_responses.jsonl -> SpecForge conversations JSONL; returns the record count."""
    n = 0
    try:
        src = open(raw_path, "rb")
    except FileNotFoundError:
        raise UserError(f"{raw_path}: no such file") from None
    with src, atomic_output(out_path, "w") as out:
        for lineno, line in enumerate(src, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                turns = [{k: m[k] for k in ("role", "content", "reasoning_content") if k in m}
                         for m in rec["messages"]]
            except (ValueError, KeyError, TypeError) as exc:
                raise UserError(f"{raw_path}:{lineno}: not a budgetgen response record ({exc})") from None
            out.write(json.dumps({"id": rec["id"], "conversations": turns}, ensure_ascii=False) + "\n")
            n += 1
    return n


def to_hf_dataset(tokenized_path, out_dir):
    """tokenized.arrow -> a save_to_disk folder with attention_mask added; returns the row count."""
    from datasets import Dataset

    if not os.path.isfile(tokenized_path):
        raise UserError(f"{tokenized_path}: no such file")
    ds = Dataset.from_file(os.fspath(tokenized_path))
    ds = ds.map(lambda row: {"attention_mask": [1] * len(row["input_ids"])}, desc=None)
    tmp = f"{out_dir}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    ds.save_to_disk(tmp)
    shutil.rmtree(out_dir, ignore_errors=True)  # a previous export: replaced whole
    os.replace(tmp, out_dir)
    return ds.num_rows
