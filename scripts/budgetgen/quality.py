"""The quality gate: what a response must be to become a training row, and to count toward the budget.

Two steps, kept apart so the journal stays a record of what happened and never of a decision:

  observe(record)  the facts of one response, journaled with it as its `flags` (just before `usage`,
                   where journal.scan reads them without parsing the line): `truncated` (finish_reason
                   length), `unclosed_reasoning` (reasoning that never closed: a server's reasoning
                   parser put the whole response into reasoning_content and left no answer, or the
                   answer holds a reasoning open tag with no close after it, or a leftover one beside a
                   separate reasoning_content), `empty` (no text at all), `reasoning_forced_end` (the
                   server ended the reasoning at the request's thinking budget), and the degenerate
                   output a broken server sends with HTTP 200 (budgetgen.degenerate): `repetition` (a
                   loop at the response's end), `replacement_chars` (U+FFFD: undecodable bytes),
                   `template_leak` (the target tokenizer's own special tokens as text).
  Gate.fate(...)   the config's decision on those facts (`quality:` in generation, a dataset or a
                   mixture cell, key by key): each fact (forced_reasoning_end for reasoning_forced_end)
                   is `keep` (a row, as if nothing were wrong), `flag` (a row whose `flags`
                   column names it) or `drop` (no row); `min_supervised_tokens: N` drops a response of
                   fewer completion tokens.

A dropped response stays in the journal and in the counts of what was generated (`generated_tokens`);
the budget counts the *kept* tokens (the completion tokens of the responses that become rows), so a
dataset whose gate drops a third of its responses still lands at its budget of kept tokens: the
budget rule learns the keep rate from the journal (lengths.LengthModel observes each length with its
fate). The gate is not part of the generation identity (it changes no request); changing it changes
what counts, and the status, the done marker and the rows follow it (identity.Policy.key() carries
its fingerprint).

Dropped responses are counted by their first reason in REASONS order (a response cut at max_tokens
inside its reasoning is `truncated`, not also `unclosed_reasoning`; a loop that ran into max_tokens is
`repetition`, the server's fault, before `truncated`). SERVER_FAULTS are the facts that say the server,
not the prompt, is wrong: the breaker (budgetgen.breaker) counts them per endpoint.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from .degenerate import leaked_token, looping, replacement_chars

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence
    from typing import Any

TRUNCATED, UNCLOSED, EMPTY, FORCED_END = "truncated", "unclosed_reasoning", "empty", "reasoning_forced_end"
REPETITION, REPLACEMENT, TEMPLATE_LEAK = "repetition", "replacement_chars", "template_leak"
TOO_SHORT = "min_supervised_tokens"
# what observe() can say of a response, in the order a dropped response's one reason is named
FACTS = (EMPTY, REPETITION, REPLACEMENT, TEMPLATE_LEAK, TRUNCATED, FORCED_END, UNCLOSED)
SERVER_FAULTS = (EMPTY, REPETITION, REPLACEMENT, TEMPLATE_LEAK)  # the server's fault, never the prompt's
REASONS = (*FACTS, TOO_SHORT)  # why a response is dropped, in the order its one reason is named
ACTIONS = ("keep", "flag", "drop")
DEFAULT_TAGS = ("<think>", "</think>")


@dataclass(frozen=True)
class Fate:
    """A response's fate under a gate: kept (a row, counting toward the budget) or dropped by `reason`;
    `flagged`: the facts the gate marks on a kept row (its `flags` column)."""

    kept: bool
    reason: str | None = None
    flagged: tuple = ()


KEPT = Fate(True)


@dataclass(frozen=True)
class Gate:
    """One dataset's or cell's `quality:` section (validated; the schema holds the defaults)."""

    truncated: str = "keep"
    unclosed_reasoning: str = "keep"
    empty: str = "drop"
    forced_reasoning_end: str = "keep"
    repetition: str = "flag"
    replacement_chars: str = "flag"
    template_leak: str = "flag"
    min_supervised_tokens: int = 0

    @classmethod
    def of(cls, section: Mapping[str, Any]) -> Gate:
        return cls(**{k: section[k] for k in cls.__dataclass_fields__ if k in section})

    def action(self, fact: str) -> str:
        return getattr(self, "forced_reasoning_end" if fact == FORCED_END else fact)

    @property
    def passes_all(self) -> bool:
        """Whether every response is kept unflagged (the gate decides nothing)."""
        return all(self.action(f) == "keep" for f in FACTS) and self.min_supervised_tokens <= 0

    def describe(self) -> dict[str, Any]:
        return asdict(self)

    def fate(self, flags: Iterable[str], completion_tokens: int) -> Fate:
        """The fate of a response with these facts (observe()) and completion tokens."""
        flags = set(flags)
        if not flags and completion_tokens >= self.min_supervised_tokens:
            return KEPT
        for fact in FACTS:
            if fact in flags and self.action(fact) == "drop":
                return Fate(False, fact)
        if completion_tokens < self.min_supervised_tokens:
            return Fate(False, TOO_SHORT)
        flagged = tuple(f for f in FACTS if f in flags and self.action(f) == "flag")
        return Fate(True, None, flagged) if flagged else KEPT


def gate_for(gates: Sequence[tuple[str, Gate]], cell: str) -> Gate:
    """The quality gate of a record's cell ((name, Gate), ...: TokenizeOptions.gates); a cell no longer
    in the config (on_settings_change: extend) takes the first cell's, as identity.Policy.cell_of does."""
    for name, gate in gates:
        if name == cell:
            return gate
    return gates[0][1]


def observe(content: str | None, reasoning: str | None, finish_reason: str | None, forced_end: bool = False,
            tags: tuple[str, str] | None = None, specials: Iterable[str] = ()) -> list[str]:
    """The facts (FACTS, in that order) of one response: its answer `content`, its separate `reasoning`
    (reasoning_content), its finish_reason, whether the server forced its reasoning's end; `tags`: the
    reasoning open and close tags (tokenizer.reasoning_tags; `<think>`/`</think>` by default);
    `specials`: the target tokenizer's special tokens (turn_format.special_tokens; none: template_leak is
    not looked for)."""
    open_tag, close_tag = tags or DEFAULT_TAGS
    content, reasoning = content or "", reasoning or ""
    facts = []
    text = "\n".join(t for t in (reasoning, content) if t)  # (content empty: the text ends where the reasoning does)
    if not content.strip() and not reasoning.strip():
        facts.append(EMPTY)
    elif looping(text):
        facts.append(REPETITION)
    if replacement_chars(text, finish_reason == "length"):
        facts.append(REPLACEMENT)
    if specials and leaked_token(text, tuple(specials), (open_tag, close_tag)):
        facts.append(TEMPLATE_LEAK)
    if finish_reason == "length":
        facts.append(TRUNCATED)
    if forced_end:
        facts.append(FORCED_END)
    opened = content.rfind(open_tag)
    unclosed_in_answer = opened >= 0 and (reasoning.strip() or content.find(close_tag, opened) < 0)
    if unclosed_in_answer or (reasoning.strip() and not content.strip()):
        facts.append(UNCLOSED)
    return facts


# tokens a server may add past the budget when it ends the reasoning: SGLang's processor forces a newline and
# then </think> (budget + 2); vLLM forces the end string, one or more tokens
FORCED_END_SLACK = 4


def reasoning_tokens(usage: Mapping[str, Any] | None) -> int | None:
    """The reasoning tokens a response's usage counts (completion_tokens_details.reasoning_tokens, which vLLM
    and SGLang fill with a reasoning parser; SGLang's top-level reasoning_tokens), or None."""
    usage = usage or {}
    details = usage.get("completion_tokens_details")
    for value in ((details or {}).get("reasoning_tokens") if isinstance(details, dict) else None,
                  usage.get("reasoning_tokens")):
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def budget_outcome(usage: Mapping[str, Any] | None, budget: int | None) -> tuple[bool, int | None]:
    """(whether the server ended the reasoning at `budget`, the reasoning tokens where they ran past it)
    from the usage: reasoning of budget .. budget + FORCED_END_SLACK tokens was ended by the server (a
    response that ended there by itself cannot be told apart), more ran past it: the server ignored the
    budget (vllm#54906: with MTP speculation). (False, None) without a budget or reasoning counts."""
    r = reasoning_tokens(usage)
    if budget is None or r is None:
        return False, None
    return budget <= r <= budget + FORCED_END_SLACK, (r if r > budget + FORCED_END_SLACK else None)


def record_flags(rec: Mapping[str, Any], tags: tuple[str, str] | None = None) -> list[str]:
    """A journal record's facts: its `flags` as journaled, else (a record journaled before flags were)
    observed from its last message now."""
    if isinstance(rec.get("flags"), list):
        return [str(f) for f in rec["flags"]]
    messages = rec.get("messages") or [{}]
    last = messages[-1] if isinstance(messages[-1], dict) else {}
    content = last.get("content") if isinstance(last.get("content"), str) else ""
    return observe(content, last.get("reasoning_content"), rec.get("finish_reason"),
                   bool(rec.get("reasoning_forced_end")), tags)


def dropped_text(dropped: Mapping[str, int]) -> str:
    """`truncated=3;empty=1` (REASONS order), or `0`: the dropped responses by reason, as summary.tsv
    and the logs write them."""
    return ";".join(f"{r}={dropped[r]}" for r in REASONS if dropped.get(r)) or "0"


KEEP_SHARE_AFTER = 50  # responses of a lane before its keep share is judged while the run goes on
CAUSES = {
    EMPTY: "{n} of {records} responses were empty (the server)",
    REPETITION: "{n} of {records} responses were loops (the server)",
    REPLACEMENT: "{n} of {records} responses held undecodable text, U+FFFD (the server or its tokenizer)",
    TEMPLATE_LEAK: "{n} of {records} responses held the tokenizer's special tokens as text (the server's chat "
                   "template or stop tokens)",
    TRUNCATED: "max_tokens {max_tokens} cut {n} of {records} responses (raise max_tokens, or quality.truncated: keep)",
    FORCED_END: "the thinking budget ended the reasoning of {n} of {records} responses (thinking_budget)",
    UNCLOSED: "the reasoning of {n} of {records} responses never closed (max_tokens {max_tokens}, or the server's "
              "reasoning parser)",
    TOO_SHORT: "quality.min_supervised_tokens dropped {n} of {records} responses",
}


def keep_problem(records: int, dropped: Mapping[str, int], min_share: float, final: bool,
                 max_tokens: int | None = None) -> tuple[str, str] | None:
    """(the commonest drop reason, why a lane's responses are not data), or None: a run must not end met or
    exhausted having kept none while dropping some, or under `min_share` of them (quality.min_keep_share).
    While the run goes on it is judged once KEEP_SHARE_AFTER responses are in, and only for drops that are
    not server faults (SERVER_FAULTS are the breaker's to judge per endpoint: a trip asks them again). The
    cause names the setting most likely at fault: `max_tokens 200 cut 40 of 40 responses`."""
    if not records or not dropped:
        return None
    kept = records - sum(dropped.values())
    if not (final and kept == 0) and (kept >= min_share * records or (not final and records < KEEP_SHARE_AFTER)):
        return None
    reason, n = max(dropped.items(), key=lambda kv: kv[1])
    if not final and reason in SERVER_FAULTS:
        return None
    cause = CAUSES.get(reason, "{n} of {records} responses dropped by " + reason)
    return reason, (f"kept {kept} of {records} responses ({kept / records:.0%}, quality.min_keep_share "
                    f"{min_share:g}): " + cause.format(n=n, records=records, max_tokens=max_tokens))
