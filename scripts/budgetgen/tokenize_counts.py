"""What the batches of one tokenized file add up to (budgetgen.tokenization writes them): records, rows,
tokens, skips, the identities they were made under, the rows held against the server's usage
(budgetgen.usage_check); the file's refusal (too many skipped, settings mixed, rows the server never made),
its provenance metadata, and its one summary line."""

from __future__ import annotations

import json
import os
from collections import Counter
from typing import TYPE_CHECKING

from budgetgen.rows import SKIP_HINTS
from budgetgen.turn_format import package_versions, tokenizer_sha256
from budgetgen.usage_check import Agreement

if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    Options = Any  # budgetgen.tokenization.TokenizeOptions (which imports this module: named, not imported)


def format_summary(rows: int, skipped: Mapping[str, int]) -> str:
    total = sum(skipped.values())
    if not total:
        return f"Tokenized: {rows} (0 skipped)"
    parts = ", ".join(f"{reason}={n}" for reason, n in sorted(skipped.items()))
    hints = "".join(f"; {SKIP_HINTS[reason]}" for reason in sorted(skipped) if reason in SKIP_HINTS)
    return f"Tokenized: {rows} ({total} skipped: {parts}){hints}"


class Tally:
    """What the batches of one file add up to: records, rows, tokens, skips, identities."""

    def __init__(self):
        self.totals = {"rows": 0, "tokens": 0, "supervised_tokens": 0, "server_id_rows": 0, "rerender_checked": 0,
                       "rerender_differs": 0}
        self.skipped, self.first_skipped, self.dropped = Counter(), {}, Counter()
        self.records = self.other_split = 0
        self.first_error = None
        self.settings = Counter()  # identity sha -> records
        self.identities = {}  # identity sha -> readable settings
        self.usage = Agreement()  # the rows built from text against the server's usage

    def add(self, stats: Mapping[str, Any]) -> str | None:
        """A batch's stats; returns the first template error seen, once."""
        self.records += stats["records"]
        self.other_split += stats["other_split"]
        self.settings.update(stats["settings"])
        for sha, readable in stats["identities"].items():
            self.identities.setdefault(sha, readable)
        self.skipped.update(stats["skipped"])
        self.dropped.update(stats["dropped"])
        self.usage.merge(stats["usage"])
        for reason, rid in stats["first_skipped"].items():
            self.first_skipped.setdefault(reason, rid)
        for key in self.totals:
            self.totals[key] += stats[key]
        if stats["error"] and self.first_error is None:
            self.first_error = stats["error"]
            return self.first_error
        return None

    def refusal(self, input_path: str, o: Options) -> str | None:
        """One line when too many records were skipped, or several identities mix; else None."""
        n_skipped, records = sum(self.skipped.values()), self.records
        if records and 100.0 * n_skipped / records > o.max_skipped_pct:
            reason, count = self.skipped.most_common(1)[0]
            return (f"{input_path}: {n_skipped} of {records} records skipped "
                    f"({100.0 * n_skipped / records:.1f} % > tokenizer.max_skipped_pct {o.max_skipped_pct:g}); "
                    f"most: {reason} ({count}, first id {self.first_skipped[reason]!r})"
                    + (f"; {SKIP_HINTS[reason]}" if reason in SKIP_HINTS else ""))
        if len(self.settings) > 1 and not o.allow_mixed_settings:
            kinds = "; ".join(f"{n} x {json.dumps(self.identities.get(k, {}).get('settings'), sort_keys=True)}"
                              for k, n in self.settings.most_common())
            return (f"{input_path}: responses were generated with {len(self.settings)} different "
                    f"content settings ({kinds}); set tokenizer.allow_mixed_settings: true "
                    "(or generation.on_settings_change: extend) to tokenize them together")
        return self.usage.problem(os.fspath(o.tokenizer), o.engine) if o.check_usage else None

    def metadata(self, o: Options, tokenizer_path: str, template_sha: str) -> dict[str, Any]:
        """The file's provenance: the generation identities its rows were made under (budgetgen.identity;
        each row's `identity` column names its own), never the config's if they differ."""
        return {
            "generation_settings": [{"identity": k, "records": n, **self.identities.get(k, {})}
                                    for k, n in self.settings.most_common()],
            "split": o.split or "all",
            "cells": sorted({v.get("cell") for v in self.identities.values()} - {None}),
            "tokenizer_sha256": tokenizer_sha256(tokenizer_path),
            "packages": package_versions(),
            "tokenizer_path": tokenizer_path,
            "chat_template_sha256": template_sha,
            "chat_template_kwargs": o.chat_template_kwargs or {},
            "max_length": int(o.max_length),
            "use_server_token_ids": bool(o.use_server_token_ids),
            "server_id_rows": self.totals["server_id_rows"],
            "usage_check": {**self.usage.describe(), "on": bool(o.check_usage)},
            # rows with the server's prompt ids whose prompt the chat template renders otherwise
            "rerender": {"checked": self.totals["rerender_checked"], "differs": self.totals["rerender_differs"]},
            "trust_remote_code": bool(o.trust_remote_code),
            "reasoning_tags": list(o.reasoning_tags) if o.reasoning_tags else None,
            "config_sha256": o.config_sha256,
            "rows": self.totals["rows"],
            "skipped": dict(sorted(self.skipped.items())),
            "dropped": dict(sorted(self.dropped.items())),  # by the quality gate (budgetgen.quality)
            "quality": [{"cell": name, **gate.describe()} for name, gate in o.gates],
        }
