"""Figures of one dataset for the Snakemake report: what is plotted is computed by pure functions
(records in, numbers out; unit-tested), drawn by `draw_*` functions with matplotlib's Agg backend.

Records are those of raw_responses.jsonl (see journal.py): `usage.completion_tokens`,
`finish_reason`, `created` (unix time the request started), `latency_s`, `attempts`, and the
assistant turn last in `messages` (its `reasoning_content` when the server sent reasoning).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from . import journal
from .conversations import record_place
from .fsutil import atomic_path

if TYPE_CHECKING:
    import os
    from collections.abc import Iterable, Mapping, Sequence
    from types import ModuleType
    from typing import Any

    from matplotlib.figure import Figure

    from .summary import RawCounts

FIGURES = ("budget", "lengths", "reasoning", "errors", "throughput", "turns", "quality")

# One colour per meaning, the same in every figure.
COLOR_TOKENS = "#2b6cb0"
COLOR_CUT = "#dd6b20"
COLOR_REASONING = "#805ad5"
COLOR_ERROR = "#c53030"
COLOR_MUTED = "#a0aec0"
STATE_COLORS = {"met": "#2f855a", "exhausted": "#b7791f", "partial": COLOR_MUTED}


# -- data ------------------------------------------------------------------------------------
def completion_tokens(rec: Mapping[str, Any]) -> int:
    return int((rec.get("usage") or {}).get("completion_tokens") or 0)


def assistant_turn(rec: Mapping[str, Any]) -> dict[str, Any]:
    messages = rec.get("messages") or []
    return messages[-1] if messages and messages[-1].get("role") == "assistant" else {}


def load_records(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The records of a raw_responses.jsonl (or journal, or errors file); [] if it does not exist."""
    return [rec for _, rec in journal.iter_records(path)]


def budget_bar(tokens: int, budget: int, state: str) -> dict[str, Any]:
    """Completion tokens against the budget; `state` is summary's met / exhausted / partial."""
    return {"tokens": int(tokens), "budget": int(budget), "state": state,
            "share": tokens / budget if budget else 1.0}


def length_histogram(records: Sequence[Mapping[str, Any]], max_tokens: int | None, bins: int = 30) -> dict[str, Any]:
    """Completion lengths in `bins` equal bins over [0, max_tokens], counted apart for responses
    cut at max_tokens (finish_reason "length") and those that finished on their own."""
    top = max([max_tokens or 0, *(completion_tokens(r) for r in records), 1])
    edges = [top * i / bins for i in range(bins + 1)]
    finished, cut = [0] * bins, [0] * bins
    for rec in records:
        i = min(bins - 1, int(completion_tokens(rec) * bins / top))
        (cut if rec.get("finish_reason") == "length" else finished)[i] += 1
    return {"edges": edges, "finished": finished, "cut": cut, "max_tokens": max_tokens}


def cut_share(records: Sequence[Mapping[str, Any]]) -> dict[str, int | float]:
    """Responses cut at max_tokens: finish_reason "length", as in results/summary.tsv."""
    cut = sum(r.get("finish_reason") == "length" for r in records)
    return {"cut": cut, "total": len(records), "share": cut / len(records) if records else 0.0}


def reasoning_tokens(rec: Mapping[str, Any]) -> tuple[int, int, str | None]:
    """(reasoning tokens, answer tokens, how): `how` is "usage" when the server counted them
    (usage.completion_tokens_details.reasoning_tokens), "estimated" when split by the character
    share of reasoning_content vs content, None when the response has no reasoning."""
    total = completion_tokens(rec)
    details = (rec.get("usage") or {}).get("completion_tokens_details") or {}
    counted = details.get("reasoning_tokens")
    if isinstance(counted, int) and not isinstance(counted, bool) and counted > 0:
        counted = min(counted, total)
        return counted, total - counted, "usage"
    turn = assistant_turn(rec)
    thought, answer = turn.get("reasoning_content") or "", turn.get("content") or ""
    if not thought:
        return 0, total, None
    share = len(thought) / (len(thought) + len(answer))
    est = round(total * share)
    return est, total - est, "estimated"


def reasoning_split(records: Iterable[Mapping[str, Any]]) -> dict[str, Any] | None:
    """Reasoning vs answer tokens over a dataset, or None when no response has reasoning."""
    reasoning = answer = counted = estimated = 0
    shares = []
    for rec in records:
        r, a, how = reasoning_tokens(rec)
        reasoning += r
        answer += a
        counted += how == "usage"
        estimated += how == "estimated"
        if r + a:
            shares.append(r / (r + a))
    if not counted and not estimated:
        return None
    return {"reasoning": reasoning, "answer": answer, "counted": counted, "estimated": estimated,
            "shares": shares}


def error_counts(records: Sequence[Mapping[str, Any]], error_records: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Failed prompts by HTTP status (errors.jsonl: not retried), and answered responses that
    needed more than one attempt (transient errors retried)."""
    failed = {}
    for rec in error_records:
        key = f"HTTP {rec.get('status')}" if rec.get("status") else "no status"
        failed[key] = failed.get(key, 0) + 1
    retried = sum(int(r.get("attempts") or 1) > 1 for r in records)
    return {"failed": dict(sorted(failed.items())), "retried": retried, "answered": len(records)}


def turn_counts(records: Iterable[Mapping[str, Any]]) -> dict[str, list[int]]:
    """Per turn index (budgetgen.conversations: 1 for single-turn prompts): responses and completion
    tokens, in turn order."""
    per = {}
    for rec in records:
        turn = record_place(rec.get("id"), rec)[1]
        n, t = per.get(turn, (0, 0))
        per[turn] = (n + 1, t + completion_tokens(rec))
    turns = sorted(per)
    return {"turns": turns, "responses": [per[t][0] for t in turns], "tokens": [per[t][1] for t in turns]}


def nice_step(raw: float) -> float:
    """The smallest of 1, 2, 5 x 10^k that is >= raw (a bin width people can read)."""
    if raw <= 0:
        return 1.0
    base = 10.0 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if m * base >= raw * (1 - 1e-9):
            return m * base
    return 10 * base


def throughput(records: Iterable[Mapping[str, Any]], max_bins: int = 60) -> dict[str, Any]:
    """Completion tokens/s over the run's wall time, in bins of a readable width.

    Each response's tokens are spread evenly over its request, [created, created + latency_s]
    (streamed tokens arrive through the request, not at its end); time 0 is the first request's
    start. A resumed run shows its pause as empty bins.
    """
    spans = []
    for rec in records:
        start = rec.get("created")
        if start is None:
            continue
        spans.append((float(start), float(start) + max(0.0, float(rec.get("latency_s") or 0)), completion_tokens(rec)))
    if not spans:
        return {"t0": None, "bin_s": 1.0, "starts": [], "tokens_per_s": [], "mean_tokens_per_s": 0.0}
    t0 = min(s for s, _, _ in spans)
    end = max(e for _, e, _ in spans)
    bin_s = nice_step(max(end - t0, 1e-3) / max_bins)
    n = max(1, math.ceil((end - t0) / bin_s - 1e-9))
    tokens = [0.0] * n
    for s, e, k in spans:
        a, b = (s - t0) / bin_s, (e - t0) / bin_s
        if b - a < 1e-12:
            tokens[min(n - 1, int(a))] += k
            continue
        for i in range(int(a), min(n - 1, int(b)) + 1):
            overlap = min(b, i + 1) - max(a, i)
            if overlap > 0:
                tokens[i] += k * overlap / (b - a)
    total = sum(k for _, _, k in spans)
    return {"t0": t0, "bin_s": bin_s, "starts": [i * bin_s for i in range(n)],
            "tokens_per_s": [t / bin_s for t in tokens], "mean_tokens_per_s": total / max(end - t0, 1e-9)}


# -- drawing ---------------------------------------------------------------------------------
def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # Text stays text in the SVG: smaller files, and the report's readers (and tests) can read it.
    plt.rcParams.update({"svg.fonttype": "none", "font.size": 10, "axes.spines.top": False,
                         "axes.spines.right": False, "svg.hashsalt": "budgetgen"})
    return plt


def _figure(plt, title, size=(7.0, 3.6)):
    fig, ax = plt.subplots(figsize=size, layout="constrained")
    fig.suptitle(title, fontsize=11, x=0.01, ha="left")
    return fig, ax


def _note(ax, text):
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="#4a5568")
    ax.set_xticks([])
    ax.set_yticks([])
    for spine in ax.spines.values():
        spine.set_visible(False)


def draw_budget(plt: ModuleType, dataset: str, bar: Mapping[str, Any], responses: int, prompts: int) -> Figure:
    fig, ax = _figure(plt, f"{dataset}: {bar['tokens']:,} of {bar['budget']:,} completion tokens "
                      f"({100 * bar['share']:.1f}%) — {bar['state']}", size=(7.0, 1.9))
    color = STATE_COLORS.get(bar["state"], COLOR_TOKENS)
    top = max(bar["tokens"], bar["budget"]) * 1.08
    ax.barh([0], [bar["budget"]], color="#edf2f7", edgecolor=COLOR_MUTED, height=0.6)
    ax.barh([0], [bar["tokens"]], color=color, height=0.6)
    ax.axvline(bar["budget"], color="#1a202c", lw=1.5)
    ax.text(bar["budget"], 0.42, f"budget {bar['budget']:,} ", ha="right", va="bottom", fontsize=8)
    ax.text(top * 0.01, 0, f"{responses:,} responses from {prompts:,} prompts",
            va="center", color="white" if bar["share"] > 0.5 else "#1a202c", fontsize=9)
    ax.set_yticks([])
    ax.set_ylim(-0.45, 0.75)
    ax.set_xlim(0, top)
    ax.set_xlabel("completion tokens the quality gate keeps (reasoning included)")
    ax.xaxis.set_major_formatter(plt.FuncFormatter(lambda x, _: f"{x:,.0f}"))
    return fig


def draw_lengths(plt: ModuleType, dataset: str, hist: Mapping[str, Any], cut: Mapping[str, Any]) -> Figure:
    fig, ax = _figure(plt, f"{dataset}: completion lengths — {cut['cut']:,} of {cut['total']:,} "
                      f"({100 * cut['share']:.1f}%) cut at max_tokens")
    stacked = [f + c for f, c in zip(hist["finished"], hist["cut"])]
    ax.stairs(hist["finished"], hist["edges"], fill=True, color=COLOR_TOKENS, label="finished (stop)")
    ax.stairs(stacked, hist["edges"], baseline=hist["finished"], fill=True, color=COLOR_CUT,
              label="cut at max_tokens (length)")
    ax.set_ylim(0, max([*stacked, 1]) * 1.1)
    if hist["max_tokens"]:
        ax.axvline(hist["max_tokens"], color="#2d3748", lw=1, ls="--")
        ax.text(hist["max_tokens"], ax.get_ylim()[1], f" max_tokens={hist['max_tokens']}", ha="right",
                va="bottom", fontsize=8)
    ax.set_xlabel("completion tokens per response")
    ax.set_ylabel("responses")
    ax.legend(fontsize=8, frameon=False)
    return fig


def draw_reasoning(plt: ModuleType, dataset: str, split: Mapping[str, Any] | None) -> Figure:
    if split is None:
        fig, ax = _figure(plt, f"{dataset}: reasoning vs answer tokens", size=(7.0, 2.2))
        _note(ax, "no reasoning in these responses (no reasoning_content, no usage reasoning_tokens)")
        return fig
    fig, (left, right) = plt.subplots(1, 2, figsize=(7.0, 3.2), layout="constrained",
                                      gridspec_kw={"width_ratios": [1, 2]})
    how = "counted by the server" if not split["estimated"] else (
        "estimated from character shares" if not split["counted"] else
        f"server counts for {split['counted']:,}, estimated for {split['estimated']:,} responses")
    fig.suptitle(f"{dataset}: reasoning vs answer tokens ({how})", fontsize=11, x=0.01, ha="left")
    total = split["reasoning"] + split["answer"]
    left.bar([0], [split["reasoning"]], color=COLOR_REASONING)
    left.bar([0], [split["answer"]], bottom=[split["reasoning"]], color=COLOR_TOKENS)
    for y, part, name in ((split["reasoning"] / 2, split["reasoning"], "reasoning"),
                          (split["reasoning"] + split["answer"] / 2, split["answer"], "answer")):
        if part:
            left.text(0, y, f"{name}\n{part:,}", ha="center", va="center", color="white", fontsize=8)
    left.set_xticks([])
    left.set_ylabel("completion tokens")
    left.set_title(f"{100 * split['reasoning'] / total if total else 0:.1f}% reasoning", fontsize=9)
    right.hist(split["shares"], bins=20, range=(0, 1), color=COLOR_REASONING, histtype="stepfilled")
    right.set_xlabel("reasoning share of a response's tokens")
    right.set_ylabel("responses")
    return fig


def draw_errors(plt: ModuleType, dataset: str, counts: Mapping[str, Any]) -> Figure:
    fig, ax = _figure(plt, f"{dataset}: errors", size=(7.0, 2.8))
    labels = [f"failed: {k}" for k in counts["failed"]] + ["answered after retries", "answered"]
    values = [*counts["failed"].values(), counts["retried"], counts["answered"]]
    colors = [COLOR_ERROR] * len(counts["failed"]) + [COLOR_CUT, COLOR_TOKENS]
    ax.barh(labels, values, color=colors)
    for i, v in enumerate(values):
        ax.text(v, i, f" {v:,}", va="center", fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("prompts")
    ax.set_xlim(0, max([*values, 1]) * 1.15)
    if not counts["failed"]:
        ax.set_title("no prompt failed", fontsize=9, loc="left")
    return fig


def draw_throughput(plt: ModuleType, dataset: str, tp: Mapping[str, Any]) -> Figure:
    fig, ax = _figure(plt, f"{dataset}: throughput over the run (mean {tp['mean_tokens_per_s']:,.0f} tok/s)")
    if not tp["starts"]:
        _note(ax, "no timestamps in these responses")
        return fig
    ax.step([*tp["starts"], tp["starts"][-1] + tp["bin_s"]], [*tp["tokens_per_s"], tp["tokens_per_s"][-1]],
            where="post", color=COLOR_TOKENS)
    ax.fill_between([*tp["starts"], tp["starts"][-1] + tp["bin_s"]], [*tp["tokens_per_s"], tp["tokens_per_s"][-1]],
                    step="post", color=COLOR_TOKENS, alpha=0.25)
    ax.set_xlabel(f"seconds since the first request (bins of {tp['bin_s']:g} s)")
    ax.set_ylabel("completion tokens/s")
    ax.set_ylim(bottom=0)
    return fig


def draw_turns(plt: ModuleType, dataset: str, counts: Mapping[str, Any], row: Mapping[str, Any]) -> Figure:
    fig, ax = _figure(plt, f"{dataset}: tokens per turn — {row['conversations']:,} conversations, "
                      f"{row['conversations_finished']:,} finished, {row['conversations_ended_by_error']:,} "
                      "ended by an error", size=(7.0, 3.0))
    if not counts["turns"]:
        _note(ax, "no responses")
        return fig
    ax.bar(counts["turns"], counts["tokens"], color=COLOR_TOKENS)
    for t, v, n in zip(counts["turns"], counts["tokens"], counts["responses"]):
        ax.text(t, v, f"{v:,}\n{n:,} rows", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(counts["turns"])
    ax.set_xlabel("turn index (1 = the first assistant turn)")
    ax.set_ylabel("completion tokens")
    ax.set_ylim(0, max(counts["tokens"]) * 1.25 or 1)
    return fig


# every reason of quality.REASONS (a unit test holds them equal; a reason without a colour would not be drawn)
REASON_COLORS = {"empty": "#dd6b20", "repetition": "#c53030", "replacement_chars": "#975a16",
                 "template_leak": "#2b6cb0", "truncated": "#d53f8c", "reasoning_forced_end": "#805ad5",
                 "unclosed_reasoning": "#718096", "min_supervised_tokens": "#2c7a7b"}


def quality_bars(raw: RawCounts) -> list[dict[str, Any]]:
    """Per (cell, split) of the records: generated, kept and dropped tokens by reason (quality.REASONS
    order), from summary.read_raw's tallies."""
    from .quality import REASONS

    return [{"lane": cell if split == "train" else f"{cell}/{split}", "kept": t.kept_tokens,
             "generated": sum(t.lengths), "dropped": {r: t.dropped_tokens[r] for r in REASONS if t.dropped[r]},
             "rows_dropped": {r: t.dropped[r] for r in REASONS if t.dropped[r]}}
            for (cell, split), t in sorted(raw.groups.items())]


def draw_quality(plt: ModuleType, dataset: str, bars: Sequence[Mapping[str, Any]]) -> Figure:
    from .quality import REASONS

    kept, generated = sum(b["kept"] for b in bars), sum(b["generated"] for b in bars)
    fig, ax = _figure(plt, f"{dataset}: {kept:,} of {generated:,} generated tokens kept by the quality gate "
                      f"({100 * kept / generated if generated else 100:.1f}%)", size=(7.0, 1.4 + 0.5 * len(bars)))
    if not bars:
        _note(ax, "no responses")
        return fig
    y = list(range(len(bars)))
    ax.barh(y, [b["kept"] for b in bars], color=COLOR_TOKENS, label="kept")
    left = [b["kept"] for b in bars]
    for reason, color in ((r, REASON_COLORS[r]) for r in REASONS):
        widths = [b["dropped"].get(reason, 0) for b in bars]
        if any(widths):
            ax.barh(y, widths, left=left, color=color, label=f"dropped: {reason}")
            left = [a + w for a, w in zip(left, widths)]
    for i, b in enumerate(bars):
        rows = ", ".join(f"{r} {n:,}" for r, n in b["rows_dropped"].items())
        ax.text(left[i], i, f" {rows or 'none dropped'}", va="center", fontsize=8)
    ax.set_yticks(y, [b["lane"] for b in bars])
    ax.invert_yaxis()
    ax.set_xlim(0, max([*left, 1]) * 1.35)
    ax.set_xlabel("completion tokens (responses dropped by reason at the right)")
    ax.xaxis.set_major_formatter(plt.FuncFormatter(lambda x, _: f"{x:,.0f}"))
    ax.legend(fontsize=8, frameon=False, loc="lower right")
    return fig


def save(fig: Figure, path: str | os.PathLike) -> None:
    """Write a figure atomically; the format is the path's extension (svg, png)."""
    plt = _pyplot()
    fmt = str(path).rsplit(".", 1)[-1].lower()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format=fmt, dpi=110, metadata={"Date": None} if fmt == "svg" else None)
    plt.close(fig)


def draw(name: str, dataset: str, records: Sequence[Mapping[str, Any]], error_records: Iterable[Mapping[str, Any]],
         row: Mapping[str, Any], max_tokens: int | None, raw: RawCounts | None = None) -> Figure:
    """One figure by name (see FIGURES); `row` is the dataset's summary row (summary.dataset_row), `raw`
    its records' tallies (summary.read_raw; the quality figure)."""
    plt = _pyplot()
    if name == "quality":
        return draw_quality(plt, dataset, quality_bars(raw) if raw is not None else [])
    if name == "budget":
        bar = budget_bar(row["kept_tokens"], row["token_budget"], row["status"])
        return draw_budget(plt, dataset, bar, row["responses"], row["prompts"])
    if name == "lengths":
        return draw_lengths(plt, dataset, length_histogram(records, max_tokens), cut_share(records))
    if name == "reasoning":
        return draw_reasoning(plt, dataset, reasoning_split(records))
    if name == "errors":
        return draw_errors(plt, dataset, error_counts(records, error_records))
    if name == "throughput":
        return draw_throughput(plt, dataset, throughput(records))
    if name == "turns":
        return draw_turns(plt, dataset, turn_counts(records), row)
    raise ValueError(f"unknown figure {name!r} (one of {', '.join(FIGURES)})")
