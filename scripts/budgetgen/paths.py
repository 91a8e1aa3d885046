"""Where a dataset's files live: DatasetPaths, written once (the rules take their patterns from it,
rules/common.smk `path_of`; the scripts their paths). At the ground: it imports nothing of the package
but errors.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from .errors import UserError

if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any


@dataclass(frozen=True)
class DatasetPaths:
    """One dataset's files. The journal and errors.jsonl are never Snakemake outputs: Snakemake deletes
    declared outputs of failed or killed jobs, and the journal is the GPU time already paid for."""

    dataset: str
    prompts: str
    journal: str
    errors: str
    status: str
    done: str
    raw_responses: str
    tokenized: str
    validation: str  # the validation split's rows (budgetgen.mixture), beside tokenized.arrow
    inference_log: str
    server_log: str

    # Where each file lives, written once: the rules take their patterns from here (rules/common.smk
    # `path_of`), the scripts their paths (of()), and a rule hands its declared files to its script
    # (`--path NAME=FILE`, with_files()).
    PATTERNS = {
        "imported_prompts": "results/{dataset}/prompts.jsonl",  # a `source` dataset's import
        "journal": "results/{dataset}/journal.jsonl", "errors": "results/{dataset}/errors.jsonl",
        "status": "results/{dataset}/budget_status.json", "done": "results/{dataset}/inference.done",
        "raw_responses": "results/{dataset}/raw_responses.jsonl", "tokenized": "results/{dataset}/tokenized.arrow",
        "validation": "results/{dataset}/validation.arrow",
        "inference_log": "logs/inference/{dataset}.log", "server_log": "logs/server/{dataset}.log",
    }

    @classmethod
    def of(cls, config: dict[str, Any], dataset: str) -> DatasetPaths:
        own = config["datasets"][dataset]
        at = {k: v.format(dataset=dataset) for k, v in cls.PATTERNS.items()}
        imported = at.pop("imported_prompts")
        prompts = imported if own.get("source") is not None else own["prompts"]
        return cls(dataset=dataset, prompts=prompts, **at)

    def with_files(self, files: Mapping[str, str]) -> DatasetPaths:
        """These paths with a rule's declared files instead ({field: path}: `--path NAME=FILE`)."""
        unknown = sorted(set(files) - set(self.__dataclass_fields__) - {"dataset"})
        if unknown:
            raise UserError(f"--path {unknown[0]}=...: not a file of a dataset "
                            f"({', '.join(f for f in self.__dataclass_fields__ if f != 'dataset')})")
        return replace(self, **files)

    def finished_outputs(self) -> tuple[str, ...]:
        """What says "this dataset is finished" downstream of the journal: the done marker, the files
        made from it (raw_responses, rows, plots, exports) and the summary of every dataset. The
        inference job removes them as it starts (budgetgen.fsutil.remove_outputs): until it ends met
        or exhausted, none of an earlier run may sit beside a journal that has moved on."""
        base = os.path.dirname(self.raw_responses)
        return (self.done, self.raw_responses, self.tokenized, self.validation, f"{base}/plots", f"{base}/export",
                os.path.join(os.path.dirname(base), "summary.tsv"))
