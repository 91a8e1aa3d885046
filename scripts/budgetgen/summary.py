"""results/summary.tsv: per dataset prompts, responses, tokens (completion_tokens: every response's;
kept_tokens: those the quality gate keeps, which the budget, budget_pct and status count; the dropped
and flagged responses by reason, budgetgen.quality), budget, state and length stats, and the
conversations (budgetgen.conversations): how many, finished, ended by an error, tokens per turn index;
the prompts it shares with other datasets; the storage forecast of an EAGLE-3 hidden-state dump of its
rows (budgetgen.forecast). A dataset of several lanes (budgetgen.mixture: mixture cells, a validation
split) gets a row per lane after its own (`cell`, `split`), with the lane's budget line and share."""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from . import conversations, journal, prompts
from .quality import KEPT, dropped_text, gate_for, record_flags
from .raw_records import record_cell, record_split, record_tokens
from .state import budget_state, lanes_of, lanes_state

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence
    from typing import Any

    from .forecast import DumpShape
    from .quality import Fate, Gate
    from .settings import InferenceSettings

COLUMNS = ["dataset", "cell", "split", "prompts", "responses", "completion_tokens", "token_budget", "budget_share",
           "budget_pct", "status", "mean_length", "p50_length", "p95_length", "cut_at_max_tokens_pct", "errors",
           "tokenized_rows", "validation_rows", "row_tokens", "hidden_state_bytes", "tokenize_skipped",
           "cross_dataset_duplicates", "conversations", "conversations_finished", "conversations_ended_by_error",
           "tokens_per_turn", "kept_tokens", "dropped", "flagged", "rows_off_usage", "rerender_differs"]


def percentile(sorted_values: Sequence[int], q: float) -> int:
    if not sorted_values:
        return 0
    i = min(len(sorted_values) - 1, max(0, int(round(q / 100.0 * (len(sorted_values) - 1)))))
    return sorted_values[i]


@dataclass
class Tally:
    """Completion lengths of responses, those cut at max_tokens, and their fates under the quality gate
    (budgetgen.quality): the kept tokens, the dropped responses and the flagged rows by reason."""

    lengths: list = field(default_factory=list)
    cut: int = 0
    kept_tokens: int = 0
    dropped: Counter = field(default_factory=Counter)
    dropped_tokens: Counter = field(default_factory=Counter)
    flagged: Counter = field(default_factory=Counter)

    def add(self, n: int, was_cut: bool, fate: Fate) -> None:
        self.lengths.append(n)
        self.cut += was_cut
        if fate.kept:
            self.kept_tokens += n
            self.flagged.update(fate.flagged)
        else:
            self.dropped[fate.reason] += 1
            self.dropped_tokens[fate.reason] += n

    def columns(self) -> dict[str, str | int]:
        """The summary columns of the gate's fates."""
        return {"kept_tokens": self.kept_tokens, "dropped": dropped_text(self.dropped),
                "flagged": dropped_text(self.flagged)}


@dataclass
class RawCounts:
    """What the summary needs of raw_responses.jsonl, read once (read_raw): the Tally of all its records
    and of each (cell, split) as finalize marked them, the ids answered and the tokens per turn."""

    all: Tally = field(default_factory=Tally)
    answered: set = field(default_factory=set)
    per_turn: dict = field(default_factory=dict)
    groups: dict = field(default_factory=dict)  # (cell, split) -> Tally


def read_raw(raw_path: str | os.PathLike, gates: Sequence[tuple[str, Gate]] = (),
             tags: tuple[str, str] | None = None) -> RawCounts:
    """One pass over raw_responses.jsonl (journal.iter_records: the validated raw-record reader); each
    record's fate under its cell's quality gate (`gates`: ((cell, Gate), ...), none: every record kept;
    `tags`: the reasoning tags, tokenizer.reasoning_tags)."""
    out = RawCounts()
    for _, rec in journal.iter_records(raw_path):
        n = record_tokens(rec)
        was_cut = rec.get("finish_reason") == "length"
        cell = record_cell(rec)
        fate = gate_for(gates, cell).fate(record_flags(rec, tags), n) if gates else KEPT
        out.all.add(n, was_cut, fate)
        out.answered.add(str(rec["id"]))
        turn = conversations.record_place(rec["id"], rec)[1]
        out.per_turn[turn] = out.per_turn.get(turn, 0) + n
        out.groups.setdefault((cell, record_split(rec)), Tally()).add(n, was_cut, fate)
    return out


def dataset_row(dataset: str, raw: RawCounts, budget: int, prompts_path: str | os.PathLike,
                errors_path: str | os.PathLike, tokenized_path: str | None = None,
                plan: conversations.Plan | None = None,
                accepts: Callable[[str], bool] | None = None) -> dict[str, str | int]:
    """One row of `raw` (read_raw); `plan`: the dataset's generation plan (default: turns last, one
    sample); `accepts(sha)`: whether errors of a generation identity count (identity.Policy.accepts;
    every one by default)."""
    lengths, cut, answered, per_turn = list(raw.all.lengths), raw.all.cut, raw.answered, raw.per_turn
    prompt_list = prompts.load_prompts(prompts_path, on_bad_line="skip").prompts
    n_prompts = len(prompt_list)
    chain_list = conversations.chains(prompt_list, plan or conversations.Plan())
    errored = set().union(*(ids for sha, ids in journal.errors_by_identity(errors_path).items()
                            if accepts is None or accepts(sha)))
    # generations that failed permanently and were not answered later (under other settings)
    errors = len(errored - answered)
    left = conversations.left(chain_list, answered, errored)
    tokens = sum(lengths)
    lengths.sort()
    status = budget_state(raw.all.kept_tokens, budget, exhausted=left.to_ask == 0)
    rows, skipped, off, rerender = "", "", "", ""
    if tokenized_path and os.path.exists(tokenized_path):
        import json

        import pyarrow as pa

        with pa.memory_map(tokenized_path) as src:
            reader = pa.ipc.open_stream(src)
            meta = json.loads((reader.schema.metadata or {}).get(b"budgetgen", b"{}"))
            rows = sum(b.num_rows for b in reader)
        # records tokenize could not make into rows, per reason (tokenization's skip reasons)
        skipped = ";".join(f"{k}={v}" for k, v in sorted((meta.get("skipped") or {}).items())) or "0"
        # rows built from text off the server's usage (budgetgen.usage_check: n of checked), and rows of the
        # server's prompt ids whose prompt the chat template renders otherwise (a trainer re-rendering errs)
        check, again = meta.get("usage_check") or {}, meta.get("rerender") or {}
        off = f"{max(check.get('completion_off', 0), check.get('prompt_off', 0))}/{check.get('rows', 0)}"
        rerender = f"{again.get('differs', 0)}/{again.get('checked', 0)}"
    n = len(lengths)
    return {
        "dataset": dataset, "cell": "all", "split": "all", "budget_share": "1", "validation_rows": "",
        "row_tokens": "", "hidden_state_bytes": "", "cross_dataset_duplicates": "", "prompts": n_prompts,
        "responses": n, "completion_tokens": tokens,
        "token_budget": budget, "budget_pct": f"{100.0 * raw.all.kept_tokens / budget:.2f}", "status": status,
        "mean_length": f"{tokens / n:.1f}" if n else "0", "p50_length": percentile(lengths, 50),
        "p95_length": percentile(lengths, 95), "cut_at_max_tokens_pct": f"{100.0 * cut / n:.2f}" if n else "0.00",
        "errors": errors, "tokenized_rows": rows, "tokenize_skipped": skipped, "conversations": len(chain_list),
        "conversations_finished": len(chain_list) - left.chains_open - left.chains_ended_by_error,
        "conversations_ended_by_error": left.chains_ended_by_error,
        "tokens_per_turn": ";".join(f"{t}:{per_turn[t]}" for t in sorted(per_turn)) or "0",
        "rows_off_usage": off, "rerender_differs": rerender, **raw.all.columns(),
    }


def _length_stats(lengths, cut):
    lengths = sorted(lengths)
    n, tokens = len(lengths), sum(lengths)
    return {"responses": n, "completion_tokens": tokens, "mean_length": f"{tokens / n:.1f}" if n else "0",
            "p50_length": percentile(lengths, 50), "p95_length": percentile(lengths, 95),
            "cut_at_max_tokens_pct": f"{100.0 * cut / n:.2f}" if n else "0.00"}


def row_tokens_by_cell(path: str | None) -> dict[str, tuple[int, int]]:
    """{cell: (rows, row tokens)} of a tokenized.arrow / validation.arrow (rows without a cell column:
    `default`); {} when the file is absent."""
    if not path or not os.path.exists(path):
        return {}
    import pyarrow as pa

    out = {}
    with pa.memory_map(path) as src:
        for batch in pa.ipc.open_stream(src):
            cells = batch.column("cell").to_pylist() if "cell" in batch.schema.names else ["default"] * batch.num_rows
            tokens = batch.column("num_tokens").to_pylist()
            for c, t in zip(cells, tokens, strict=True):
                rows, total = out.get(c, (0, 0))
                out[c] = (rows + 1, total + t)
    return out


def add_rows_and_forecast(row: dict[str, str | int], tokenized: Mapping[str, tuple[int, int]],
                          validation: Mapping[str, tuple[int, int]], shape: DumpShape | None,
                          cell: str | None = None) -> dict[str, str | int]:
    """The row's tokenized_rows / validation_rows, row_tokens (both files) and hidden_state_bytes (the
    storage forecast of a dump of those rows: budgetgen.forecast; empty without the model's config);
    `cell`: one cell's rows only."""
    pick = (lambda d: [v for k, v in d.items() if k == cell]) if cell else (lambda d: list(d.values()))  # noqa: E731
    train, val = pick(tokenized), pick(validation)
    tokens = sum(t for _, t in train) + sum(t for _, t in val)
    if cell:
        row["tokenized_rows"] = sum(r for r, _ in train)
    row["validation_rows"] = sum(r for r, _ in val) if validation else ""
    row["row_tokens"] = tokens
    row["hidden_state_bytes"] = shape.bytes_for(tokens) if shape is not None else ""
    return row


def lane_rows(dataset: str, raw: RawCounts, lanes: Mapping[str, Mapping[str, Any]],
              tokenized: Mapping[str, tuple[int, int]], validation: Mapping[str, tuple[int, int]],
              shape: DumpShape | None) -> list[dict[str, str | int]]:
    """A row per lane (`lanes`: the status's {key: LaneAccount.summary()} with the budget now), from the
    records of raw_responses.jsonl (`raw`: read_raw) that finalize marked with their cell and split."""
    rows = []
    for v in lanes.values():
        tally = raw.groups.get((v["cell"], v["split"])) or Tally()
        stats = _length_stats(tally.lengths, tally.cut)
        budget = v["budget"]
        row = {c: "" for c in COLUMNS}
        row.update(stats, dataset=dataset, cell=v["cell"], split=v["split"], prompts=v.get("prompts", ""),
                   token_budget=budget, budget_share=f"{v['budget_share']:.4g}",
                   budget_pct=f"{100.0 * tally.kept_tokens / budget:.2f}" if budget else "",
                   status=budget_state(tally.kept_tokens, budget, v["exhausted"]), errors=v["errors"],
                   **tally.columns())
        held_out = v["split"] == "validation"
        rows.append(add_rows_and_forecast(row, {} if held_out else tokenized, validation if held_out else {},
                                          shape, v["cell"]))
    return rows


def format_tsv(rows: Iterable[Mapping[str, object]]) -> str:
    out = ["\t".join(COLUMNS)]
    out += ["\t".join(str(r[c]) for c in COLUMNS) for r in rows]
    return "\n".join(out) + "\n"


def mixture_status(s: InferenceSettings) -> tuple[dict[str, Any], dict[str, dict[str, Any]], str]:
    """(status, {lane: account}, state) of a dataset of several lanes (settings.InferenceSettings `s`):
    its state is every lane's (budgetgen.state.lanes_state: met only when every lane is), the one
    summary.tsv, the report's figures and the done marker say."""
    from .status import compute_status

    st = compute_status(s)
    lanes = lanes_of(st, s.mixture.budgets())
    return st, lanes, lanes_state(lanes)

