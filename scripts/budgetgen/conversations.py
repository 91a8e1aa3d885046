"""How prompts become generations: conversations, their turns, samples, and the ids of each.

The generation plan of a dataset (`Plan`, from `generation.turns`, `generation.samples_per_prompt`
and `generation.history_reasoning`):

  turns: last   one generation per conversation: the next assistant turn after the prompt as the
                prompts file gives it (earlier assistant turns are the dataset's own). The default:
                ids and params are those of every journal written before the setting existed, so such
                a journal resumes without regenerating anything, and a conversation costs one request.
  turns: all    every assistant turn is the target's own (on-policy, as SpecForge and speculators
                regenerate): a conversation with user turns u1..un is generated in sequence, a1 from
                [u1], a2 from [u1, a1, u2], ... Each turn is one request, one journal record and one
                training row.

A *chain* is one sample of one conversation: id `ID` (samples_per_prompt 1) or `ID/s1` .. `ID/sN`.
Its generations have the id of the chain (turns: last) or `CHAIN/t1` .. `CHAIN/tn` (turns: all).
Every id is a function of the prompt id and the plan alone, so a resumed run finds each generation
by id: the journal holds the turns done, the next turn's history is the last journaled turn's
messages. Sample and turn suffixes are the same for every prompt of a dataset, so ids stay unique.

Turns of a conversation (`segments`): the prompt's messages split at its assistant messages (which
`turns: all` replaces by the target's answers). Messages before the first user turn (a system
prompt, an assistant greeting) open the first segment; a system message between turns opens the
segment of the next user turn; an assistant message that follows another one is dropped with it.

History sent back (`history_reasoning`): `drop` sends earlier answers as content only (what
Qwen3-style templates expect, and what they would render anyway); `keep` sends their
`reasoning_content` too (templates that keep earlier reasoning: newer Kimi and DeepSeek releases).
The plan is part of the generation identity (budgetgen.identity), which every record stores.

What is left (`left`): a chain is finished when all its turns are journaled; a permanent error on
turn k ends it at k-1 (its first missing turn failed under the current request params). The budget
status, the inference job and the summary count generations left the same way, through here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Container, Iterable, Mapping
    from typing import Any

    from .prompts import Prompt

TURNS = ("last", "all")


@dataclass(frozen=True)
class Plan:
    turns: str = "last"
    samples: int = 1
    history_reasoning: str = "drop"




def segments(messages: Iterable[Mapping[str, Any]]) -> list[list[dict[str, Any]]]:
    """The user turns of a conversation: a list of message lists, each ending with a user message,
    the dataset's assistant answers between them left out (see the module docstring)."""
    out, current, seen_user = [], [], False
    for m in messages:
        if m["role"] == "assistant":
            if seen_user:
                out.append(current)
                current, seen_user = [], False
            elif not out:
                current.append(dict(m))  # context before any user turn: kept
            continue
        current.append(dict(m))
        seen_user = seen_user or m["role"] == "user"
    if seen_user:
        out.append(current)
    elif current and out:  # trailing non-user messages (none after normalisation): with the last turn
        out[-1].extend(current)
    return out


def history_message(message: Mapping[str, Any], history_reasoning: str) -> dict[str, Any]:
    """An earlier answer as it is sent back to the server."""
    m = {"role": "assistant", "content": message.get("content") or ""}
    if history_reasoning == "keep" and message.get("reasoning_content"):
        m["reasoning_content"] = message["reasoning_content"]
    return m


@dataclass(frozen=True)
class Chain:
    """One sample of one conversation."""

    id: str
    sample: int
    messages: tuple  # the prompt's normalised messages
    prompt_id: str  # the source prompt, shared by its samples and turns
    turn_segments: tuple  # turns: all: the user turns; turns: last: the whole prompt, one turn
    plan: Plan

    @property
    def n_turns(self) -> int:
        return len(self.turn_segments)

    def turn_id(self, k: int) -> str:
        """The journal id of turn k (1-based)."""
        return self.id if self.plan.turns == "last" else f"{self.id}/t{k}"

    def ids(self) -> list[str]:
        return [self.turn_id(k) for k in range(1, self.n_turns + 1)]

    def turn_index(self, k: int) -> int:
        """The turn a row belongs to: k of n (turns: all); the prompt's own count (turns: last)."""
        if self.plan.turns == "all":
            return k
        return len(segments(self.messages))

    def where(self, k: int) -> dict[str, str | int]:
        """What a record of turn k says of its place: conversation id, source prompt, turn (and sample)."""
        w = {"conversation_id": self.id, "prompt_id": self.prompt_id, "turn": self.turn_index(k)}
        if self.plan.samples > 1:
            w["sample"] = self.sample
        return w

    def request(self, k: int, previous: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
        """The messages of turn k's request; `previous`: turn k-1's journal record (k > 1)."""
        if k == 1:
            return [dict(m) for m in self.turn_segments[0]]
        if previous is None:
            raise ValueError(f"{self.turn_id(k)}: turn {k} needs turn {k - 1}'s record")
        history = [history_message(m, self.plan.history_reasoning) if m["role"] == "assistant" else dict(m)
                   for m in previous["messages"]]
        return history + [dict(m) for m in self.turn_segments[k - 1]]

    def first_missing(self, journaled_ids: Container[str]) -> int | None:
        """The first turn not journaled (turns are made in order), or None when all are."""
        for k in range(1, self.n_turns + 1):
            if self.turn_id(k) not in journaled_ids:
                return k
        return None


def record_place(rid: object, record: Mapping[str, Any]) -> tuple[str, int]:
    """(conversation id, turn index) of a journal record: as the record says, else (records written
    before they said) the record's id and the count of its prompt's user turns."""
    conv = record.get("conversation_id")
    turn = record.get("turn")
    if not isinstance(turn, int) or isinstance(turn, bool):
        turn = max(1, len(segments(record["messages"][:-1])))
    return (str(conv) if conv is not None else str(rid)), turn


def record_prompt_id(rid: object, record: Mapping[str, Any]) -> str:
    """The source prompt of a journal record (shared by its samples and turns): as the record says, else
    (records written before they said) its conversation less the sample suffix."""
    pid = record.get("prompt_id")
    if pid is not None:
        return str(pid)
    conv, _ = record_place(rid, record)
    suffix = f"/s{record['sample']}" if "sample" in record else ""
    return conv[: -len(suffix)] if suffix and conv.endswith(suffix) else conv


def chains(prompt_list: Iterable[Prompt], plan: Plan) -> list[Chain]:
    """The chains of a prompt set, in prompt order."""
    out = []
    for p in prompt_list:
        segs = segments(p.messages) if plan.turns == "all" else [list(p.messages)]
        for s in range(1, plan.samples + 1):
            cid = p.id if plan.samples == 1 else f"{p.id}/s{s}"
            out.append(Chain(id=cid, sample=s, messages=p.messages, prompt_id=p.id,
                             turn_segments=tuple(tuple(seg) for seg in segs), plan=plan))
    return out


@dataclass
class Left:
    """Generations still to ask: `remaining` ignoring errors, `blocked` those a permanent error
    ended (per the error ids given), and chains counted the same way."""

    remaining: int = 0
    blocked: int = 0
    chains_open: int = 0
    chains_ended_by_error: int = 0

    @property
    def to_ask(self) -> int:
        return self.remaining - self.blocked


def left(chain_list: Iterable[Chain], journaled_ids: Container[str], errored_ids: Iterable[str] = ()) -> Left:
    """What is left of the chains, given the journaled ids and the ids failed permanently (under the
    params that count; see the module docstring)."""
    errored_ids = set(errored_ids)
    out = Left()
    for c in chain_list:
        k = c.first_missing(journaled_ids)
        if k is None:
            continue
        out.remaining += c.n_turns - k + 1
        if c.turn_id(k) in errored_ids:
            out.blocked += c.n_turns - k + 1
            out.chains_ended_by_error += 1
        else:
            out.chains_open += 1
    return out
