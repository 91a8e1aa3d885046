"""A read-only view of a working directory while a run writes it (scripts/watch.py).

Per dataset: tokens of the budget (kept by the quality gate, budgetgen.quality, with the responses it
dropped beside them; or generations of those there are, for a dataset on its way to being
exhausted), the state, tok/s and req/s over the last minute, the ETA, the errors, the GPU-hours
(server.gpus) and hidden-state storage still to come; and a total
line (the tokens left of every dataset not finished, over the aggregate rate).

Read only, never in the way of a run: it reads the journals, errors.jsonl, the status and the done
markers, and nothing else; it takes no lock (neither Snakemake's nor the journal's) and writes nothing,
so it works from another shell or a login node while a run holds Snakemake's lock. A journal is
followed incrementally (`journal_follow.JournalFollower`): each refresh reads only the bytes appended since the last
one, up to the last whole line (a torn tail is read once it is whole), and starts over when the file
was replaced or shrank. Records count under the generation identities that count now
(budgetgen.identity), as every other reader counts them.

Rates come from the records themselves: a record's completion is its `created` + `latency_s`.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from . import conversations, journal, prompts, state
from .errors import UserError
from .estimate import server_gpus
from .forecast import human_bytes
from .journal_follow import JournalFollower

if TYPE_CHECKING:
    from collections.abc import Sequence

    from rich.table import Table

    from .settings import InferenceSettings

WINDOW_S = 60.0


@dataclass
class DatasetView:
    name: str
    tokens: int
    budget: int
    responses: int
    generations_done: int
    generations: int
    state: str
    req_s: float
    tok_s: float
    eta_s: float | None
    errors: int
    dropped: int = 0  # responses the quality gate drops (budgetgen.quality): journaled, not counted
    kept_tok_s: float | None = None  # the rate of kept tokens (None: tok_s, nothing dropped)
    gpu_hours_left: float | None = None  # ETA x the server's GPUs (budgetgen.estimate.server_gpus)
    storage_left: int | None = None  # hidden-state bytes of the rows still to come (budgetgen.forecast)

    @property
    def budget_rate(self) -> float:
        """Tokens per second toward the budget: the kept ones'."""
        return self.tok_s if self.kept_tok_s is None else self.kept_tok_s

    @property
    def pct(self) -> float:
        return 100.0 * self.tokens / self.budget if self.budget else 100.0

    @property
    def finished(self) -> bool:
        return self.state in (state.MET, state.MET_BY_JOURNAL, state.EXHAUSTED)


class Watcher:
    """The views of every dataset of a validated config, refreshed on demand (relative to the
    current working directory, as the workflow's paths are)."""

    def __init__(self, config):
        from .settings import InferenceSettings

        self.settings = [InferenceSettings.from_config(config, ds) for ds in sorted(config["datasets"])]
        self.followers = {s.dataset: JournalFollower(s.paths.journal, s.policy.accepts,
                                                             s.mixture.gate_of(s.policy))
                          for s in self.settings}
        self.generations = {}  # dataset -> (prompts file mtime, generations the plan makes of it)
        self.gpus = server_gpus(config["server"])

    def _generations(self, s):
        try:
            mtime = os.path.getmtime(s.paths.prompts)
        except FileNotFoundError:
            return 0
        cached = self.generations.get(s.dataset)
        if cached is None or cached[0] != mtime:
            try:
                chain_list = conversations.chains(prompts.load_prompts(s.paths.prompts, on_bad_line="skip").prompts,
                                                  s.plan)
            except UserError:
                return 0
            cached = self.generations[s.dataset] = (mtime, sum(c.n_turns for c in chain_list))
        return cached[1]

    def view(self, s: InferenceSettings, now: float) -> DatasetView:
        f = self.followers[s.dataset].refresh()
        files = state.DatasetFiles(journal=s.paths.journal, done=s.paths.done, status=s.paths.status,
                                   prompts=s.paths.prompts)
        st, _ = state.dataset_state(files, s.mixture.budgets(), s.policy.key())
        if f.problem:
            st = f"error: {f.problem}"
        else:  # (a mixture is met lane by lane: the status and the done marker say so)
            st = state.journal_state(st, s.policy.changes(f.by_identity), f.tokens >= s.budget and s.mixture.plain,
                                     f.records > 0, state.finalized(files, s.policy.key()))
        errored = set().union(*(ids for sha, ids in journal.errors_by_identity(s.paths.errors).items()
                                if s.policy.accepts(sha)))
        req_s, tok_s, kept_tok_s = f.rates(now, WINDOW_S)
        left = s.budget - f.tokens
        finished = left <= 0 or st in (state.MET, state.MET_BY_JOURNAL, state.EXHAUSTED)
        eta = 0.0 if finished else (left / kept_tok_s if kept_tok_s > 0 else None)
        ratio = f.prompt_tokens / f.generated_tokens if f.generated_tokens else 0.0
        storage = s.forecast.bytes_for(max(0, left) * (1 + ratio)) if s.forecast is not None else None
        gpu_h = eta * self.gpus / 3600 if eta is not None and self.gpus else None
        return DatasetView(s.dataset, f.tokens, s.budget, f.records, len(f.ids), self._generations(s), st, req_s,
                           tok_s, eta, len(errored - f.ids), sum(f.dropped.values()), kept_tok_s, gpu_h, storage)

    def views(self, now: float | None = None) -> list[DatasetView]:
        now = time.time() if now is None else now
        out = []
        for s in self.settings:
            try:
                out.append(self.view(s, now))
            except UserError as exc:  # errors.jsonl with a bad line: said in the row, the view goes on
                out.append(DatasetView(s.dataset, 0, s.budget, 0, 0, 0, f"error: {exc}", 0.0, 0.0, None, 0))
        return out


def total(views: Sequence[DatasetView]) -> tuple[int, int, int, float, float | None]:
    """(tokens, budget, tokens left of the datasets not finished, tok/s, ETA seconds or None)."""
    left = sum(max(0, v.budget - v.tokens) for v in views if not v.finished)
    tps = sum(v.tok_s for v in views)
    kept_tps = sum(v.budget_rate for v in views)
    eta = 0.0 if left == 0 else (left / kept_tps if kept_tps > 0 else None)
    return sum(v.tokens for v in views), sum(v.budget for v in views), left, tps, eta


def short_text(views: Sequence[DatasetView]) -> str:
    """`, 35,000 short in exhausted datasets`: the budget no job will run for (the finished datasets that
    ran out of prompts before their budget), beside the tokens left to run; '' where there is none."""
    short = sum(max(0, v.budget - v.tokens) for v in views if v.finished)
    return f", {short:,} short in exhausted datasets" if short else ""


TSV_COLUMNS = ["dataset", "tokens", "budget", "budget_pct", "responses", "generations_done", "generations",
               "state", "tok_s", "req_s", "eta_s", "errors", "dropped", "gpu_hours_left", "hidden_state_bytes_left"]


def format_tsv(views: Sequence[DatasetView]) -> str:
    lines = ["\t".join(TSV_COLUMNS)]
    for v in views:
        lines.append("\t".join(str(x) for x in (
            v.name, v.tokens, v.budget, f"{v.pct:.2f}", v.responses, v.generations_done, v.generations, v.state,
            f"{v.tok_s:.1f}", f"{v.req_s:.2f}", "" if v.eta_s is None else f"{v.eta_s:.0f}", v.errors, v.dropped,
            "" if v.gpu_hours_left is None else f"{v.gpu_hours_left:.2f}",
            "" if v.storage_left is None else v.storage_left)))
    tokens, budget, left, tps, eta = total(views)
    pct = f"{100.0 * tokens / budget if budget else 100:.2f}"
    left_text = f"{left} left to run" + short_text(views)
    lines.append("\t".join(str(x) for x in ("TOTAL", tokens, budget, pct,
                                           sum(v.responses for v in views), "", "", left_text, f"{tps:.1f}",
                                           f"{sum(v.req_s for v in views):.2f}", "" if eta is None else f"{eta:.0f}",
                                           sum(v.errors for v in views), sum(v.dropped for v in views),
                                           _sum_or_blank([v.gpu_hours_left for v in views], "{:.2f}"),
                                           _sum_or_blank([v.storage_left for v in views], "{}"))))
    return "\n".join(lines) + "\n"


def _sum_or_blank(values, fmt):
    return "" if not values or None in values else fmt.format(sum(values))


COLUMNS = (("dataset", "left"), ("progress", "left"), ("tokens / budget", "right"), ("%", "right"), ("state", "left"),
           ("tok/s", "right"), ("req/s", "right"), ("ETA", "right"), ("errors", "right"), ("dropped", "right"),
           ("GPU-h left", "right"), ("hidden states left", "right"))
BAR_WIDTH = 20


def _rows(views):
    """The table's rows, the same for the rich table and the plain one: per view (cells, bar) with bar
    (completed, total) of tokens of the budget, or of generations for a dataset being exhausted; then
    the total line (its bar None)."""
    from .progress import fmt_eta

    out = []
    for v in views:
        # a dataset running out of prompts: the generations it has left; one that ran out (exhausted): its
        # real share of the budget, like every other
        exhausting = v.state != state.EXHAUSTED and not v.finished and bool(
            v.generations and v.generations_done >= v.generations)
        bar = ((v.generations_done, max(1, v.generations)) if exhausting
               else (min(v.tokens, v.budget), max(1, v.budget)))
        out.append(([v.name, "", f"{v.tokens:,} / {v.budget:,}", f"{v.pct:.1f}", v.state, f"{v.tok_s:,.0f}",
                     f"{v.req_s:.2f}", fmt_eta(v.eta_s), str(v.errors), str(v.dropped),
                     "?" if v.gpu_hours_left is None else f"{v.gpu_hours_left:.2f}",
                     "?" if v.storage_left is None else human_bytes(v.storage_left)], bar))
    tokens, budget, left, tps, eta = total(views)
    left_text = f"{left:,} tokens left to run" + short_text(views)
    out.append((["total", "", f"{tokens:,} / {budget:,}", f"{100.0 * tokens / budget if budget else 100:.1f}",
                 left_text, f"{tps:,.0f}", f"{sum(v.req_s for v in views):.2f}", fmt_eta(eta),
                 str(sum(v.errors for v in views)), str(sum(v.dropped for v in views)),
                 _sum_or_blank([v.gpu_hours_left for v in views], "{:.2f}") or "?",
                 (human_bytes(sum(v.storage_left for v in views))
                  if views and None not in [v.storage_left for v in views] else "?")], None))
    return out


def format_plain(views: Sequence[DatasetView], title: str) -> str:
    """The table as plain text (no escape sequences, no box drawing: a pipe, a file, a CI log), the
    title first and the total line last, below a rule."""
    rows = []
    for cells, bar in _rows(views):
        if bar is not None:
            done, of = bar
            filled = min(BAR_WIDTH, int(BAR_WIDTH * done / of))
            cells[1] = "[" + "#" * filled + "-" * (BAR_WIDTH - filled) + "]"
        rows.append(cells)
    header = [name for name, _ in COLUMNS]
    widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(COLUMNS))]

    def line(cells):
        return "  ".join(c.ljust(w) if justify == "left" else c.rjust(w)
                         for c, w, (_, justify) in zip(cells, widths, COLUMNS)).rstrip()

    body = [line(header)] + [line(r) for r in rows[:-1]] + ["-" * len(line(header)), line(rows[-1])]
    return "\n".join([title] + body) + "\n"


def render(views: Sequence[DatasetView], title: str) -> Table:
    """A rich Table of the views (progress bars of tokens of the budget, or of generations for a
    dataset being exhausted) and the total line: for a terminal (format_plain elsewhere)."""
    from rich.progress_bar import ProgressBar
    from rich.table import Table

    table = Table(title=title, title_justify="left", expand=False)
    for name, justify in COLUMNS:
        table.add_column(name, justify=justify, no_wrap=True, min_width=len(name))
    rows = _rows(views)
    for cells, (done, of) in rows[:-1]:
        cells[1] = ProgressBar(total=of, completed=done, width=BAR_WIDTH)
        table.add_row(*cells)
    table.add_section()
    table.add_row(*rows[-1][0])
    return table
