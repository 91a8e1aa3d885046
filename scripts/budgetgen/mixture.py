"""Mixture cells and the on-policy validation split: how one dataset's budget and prompts divide.

Cells. A dataset (or `generation`, for every dataset) may declare `mixture: {NAME: {share, ...}}`:
each cell a share of the dataset's token budget (the shares sum to 1) and content-setting overrides
(max_tokens, temperature, top_p, extra_body, turns, history_reasoning, samples_per_prompt) over the
dataset's own settings; extra_body is merged over the dataset's, its chat_template_kwargs key by key.
Each cell is its own generation identity (budgetgen.identity; two cells with the same settings are
refused), so a cell's settings change follows the identity rules, while a share change only moves
budget lines. A dataset without a mixture is one cell, `default`, whose identity is the dataset's.

Validation. `validation: {share: v}` holds out the prompts whose seeded hash (generation.seed) of
their normalised content (prompts.stable_id of the normalised messages, not the id: a duplicate under
another id lands in the same split) falls below v. The split is a function of the prompt, computed
wherever it is needed; records store it too, for whoever reads a journal.

Lanes. A lane is one cell in one split, with the budget token_budget x share x (1 - v) (train) or x v
(validation), rounded so the lanes sum to the budget; met or exhausted on its own. Each lane has its
own budget rule (its lengths are its cell's). The dataset is met when every lane is, exhausted when
every lane is met or exhausted and one is not met.

Prompts are claimed by cells, disjointly, in the seeded dispatch order: when a lane needs a new
prompt it takes the next unclaimed prompt of its split. A prompt is a cell's once a record or a
permanent error of that cell's identity names it (so a resume continues it in the same cell); the
prompts a cell holds are a uniform sample of the pool, whatever the cells' lengths, and no prompt
is in two cells.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from . import conversations
from .identity import layout_sha
from .prompts import dispatch_order, stable_id
from .quality import Gate

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence
    from typing import Any

    from .identity import Policy
    from .journal import JournalState
    from .prompts import Prompt

DEFAULT_CELL = "default"
TRAIN, VALIDATION = "train", "validation"


def merged_extra_body(base: Mapping[str, Any] | None, override: Mapping[str, Any] | None) -> dict[str, Any]:
    """A cell's extra_body: the dataset's, with the cell's keys over it (chat_template_kwargs key by key)."""
    out = dict(base or {})
    for k, v in (override or {}).items():
        if k == "chat_template_kwargs" and isinstance(v, dict):
            out[k] = {**(out.get(k) or {}), **v}
        else:
            out[k] = v
    return out


@dataclass(frozen=True)
class Cell:
    """One mixture cell: its share of the budget, its request params and plan, its identity."""

    name: str
    share: float
    params: dict  # budgetgen.identity.request_params (model, max_tokens, temperature?, top_p?, extra_body?)
    plan: conversations.Plan
    identity: object  # identity.Identity
    gate: Gate = Gate()  # its quality gate (budgetgen.quality)

    @property
    def max_tokens(self) -> int:
        return int(self.params["max_tokens"])

    @property
    def chat_template_kwargs(self) -> dict[str, Any]:
        return dict((self.params.get("extra_body") or {}).get("chat_template_kwargs") or {})


@dataclass(frozen=True)
class Lane:
    """One cell in one split, with its budget line."""

    cell: Cell
    split: str
    budget: int

    @property
    def key(self) -> str:
        return lane_key(self.cell.name, self.split)

    def describe(self) -> dict[str, str | float]:
        """What the status and the done marker say of the lane itself."""
        return {"cell": self.cell.name, "split": self.split, "share": self.cell.share,
                "identity": self.cell.identity.sha}


def lane_key(cell: str, split: str) -> str:
    """`CELL` (train) or `CELL/validation`: how a lane is named in the status, the tables and the logs."""
    return cell if split == TRAIN else f"{cell}/{split}"


def split_budgets(budget: int, shares: Sequence[float], validation_share: float) -> list[tuple[int, int]]:
    """[(train, validation) tokens per cell]: the cells' shares of `budget`, each split by the validation
    share, rounded so that everything sums to `budget`."""
    out, given = [], 0
    for i, share in enumerate(shares):
        cell = budget - given if i == len(shares) - 1 else int(round(budget * share))
        given += cell
        val = int(round(cell * validation_share))
        out.append((cell - val, val))
    return out


@dataclass(frozen=True)
class Mixture:
    """A dataset's cells and validation split (see the module docstring)."""

    cells: tuple  # Cell, in config order
    validation_share: float
    seed: int
    lanes: tuple  # Lane: each cell's train lane, then (validation_share > 0) each cell's validation lane

    @classmethod
    def of(cls, cells: Sequence[Cell], budget: int, validation_share: float, seed: int) -> Mixture:
        budgets = split_budgets(budget, [c.share for c in cells], validation_share)
        lanes = [Lane(c, TRAIN, b[0]) for c, b in zip(cells, budgets, strict=True)]
        if validation_share > 0:
            lanes += [Lane(c, VALIDATION, b[1]) for c, b in zip(cells, budgets, strict=True)]
        return cls(tuple(cells), float(validation_share), int(seed), tuple(lanes))

    @property
    def plain(self) -> bool:
        """One cell, no validation split: the dataset as it was before mixtures."""
        return len(self.cells) == 1 and self.validation_share <= 0

    @property
    def splits(self) -> tuple[str, ...]:
        return (TRAIN, VALIDATION) if self.validation_share > 0 else (TRAIN,)

    def cell(self, name: str) -> Cell:
        return next(c for c in self.cells if c.name == name)

    def layout_sha(self) -> str | None:
        """What the lanes' counts depend on besides the budget: the cells' identities and the split."""
        if self.plain:
            return None
        return layout_sha([(c.name, c.identity.sha) for c in self.cells], self.validation_share, self.seed)

    def budgets(self) -> dict[str, int]:
        """{lane key: budget}."""
        return {lane.key: lane.budget for lane in self.lanes}

    def split_of(self, messages: Iterable[dict[str, Any]]) -> str:
        """The split of a prompt (its normalised messages): a seeded hash of its content."""
        if self.validation_share <= 0:
            return TRAIN
        h = hashlib.sha256(f"{self.seed}:validation:{stable_id(messages)}".encode()).digest()
        return VALIDATION if int.from_bytes(h[:8], "big") / 2**64 < self.validation_share else TRAIN

    def prompt_splits(self, prompt_list: Iterable[Prompt]) -> dict[str, str]:
        """{prompt id: split}."""
        return {p.id: self.split_of(p.messages) for p in prompt_list}

    def generation_prompts(self, prompt_list: Sequence[Prompt]) -> dict[str, str]:
        """{generation id: prompt id} of every generation any cell's plan can make of the prompts."""
        out = {}
        plans = list(dict.fromkeys(c.plan for c in self.cells))
        for plan in plans:
            for chain in conversations.chains(prompt_list, plan):
                for gid in chain.ids():
                    out[gid] = chain.prompt_id
        return out

    def placer(self, policy: Policy,
               prompt_list: Sequence[Prompt] | None = None) -> Callable[[str, str, str | None], tuple[str, str]]:
        """place(sha, id, cell_named) -> (cell, split) of a counted record: its cell (policy.cell_of its
        identity; `cell_named`: the cell the record names, for identities of earlier settings), and its
        prompt's split (train where the prompt is not among `prompt_list`, or without a validation
        split)."""
        if self.validation_share <= 0 or prompt_list is None:
            return lambda sha, rid, named: (policy.cell_of(sha, named), TRAIN)
        splits = self.prompt_splits(prompt_list)
        gen_prompt = self.generation_prompts(prompt_list)
        return lambda sha, rid, named: (policy.cell_of(sha, named), splits.get(gen_prompt.get(rid), TRAIN))

    def gate_of(self, policy: Policy) -> Callable[[str, str | None], Gate]:
        """journal.scan(gate_of=): the quality gate of a counted record's cell (see placer)."""
        return lambda sha, named: self.cell(policy.cell_of(sha, named)).gate

    def lane_of(self, policy: Policy,
                prompt_list: Sequence[Prompt] | None = None) -> Callable[[str, str, str | None], str]:
        """journal.scan(lane_of=): the lane key of a counted record (see placer)."""
        place = self.placer(policy, prompt_list)
        return lambda sha, rid, named: lane_key(*place(sha, rid, named))


@dataclass
class LaneAccount:
    """Where one lane stands: its counted tokens and records, the prompts it holds (in dispatch order)
    and their chains under its cell's plan, what is left of them, met / exhausted."""

    lane: Lane
    tokens: int = 0
    records: int = 0
    prompts: list = None
    chains: list = None
    left: conversations.Left = None
    errors: int = 0
    exhausted: bool = False  # nothing left to ask (met or not): budgetgen.state.lanes_state decides
    generated_tokens: int = 0  # kept or dropped by the quality gate (`tokens`: the kept)
    dropped: dict = None  # reason -> responses the gate drops

    def summary(self) -> dict[str, Any]:
        """What the status and the done marker keep of a lane."""
        return {**self.lane.describe(), "budget": self.lane.budget, "tokens": self.tokens,
                "generated_tokens": self.generated_tokens, "dropped": dict(self.dropped or {}),
                "responses": self.records, "prompts": len(self.prompts or ()), "errors": self.errors,
                "exhausted": self.exhausted}


def account(mix: Mixture, policy: Policy, prompt_list: Sequence[Prompt], journaled: JournalState,
            errors_by_sha: Mapping[str, Iterable[str]]) -> tuple[dict[str, LaneAccount], dict[str, list[Prompt]]]:
    """Each lane's LaneAccount, and the unclaimed prompts of each split in dispatch order
    ({split: [Prompt]}), from the journal (a JournalState scanned with mix.lane_of(policy, prompt_list))
    and the permanent errors ({identity sha: ids}, journal.errors_by_identity). See the module docstring
    for how prompts are claimed."""
    by_id = {p.id: p for p in prompt_list}
    gen_prompt = mix.generation_prompts(prompt_list)
    splits = mix.prompt_splits(prompt_list)
    claimed = {}  # prompt id -> cell name
    for rid, key in journaled.id_lane.items():
        pid = gen_prompt.get(rid)
        if pid is not None:
            claimed.setdefault(pid, key.split("/")[0])
    errored = {}  # cell -> ids failed permanently under its identity now
    for name, ident in policy.identities:
        ids = set(errors_by_sha.get(ident.sha, ()))
        errored[name] = ids
        for rid in ids:
            pid = gen_prompt.get(rid)
            if pid is not None:
                claimed.setdefault(pid, name)
    order = [by_id[i] for i in dispatch_order(by_id, mix.seed)]
    pool = {split: [p for p in order if p.id not in claimed and splits[p.id] == split] for split in mix.splits}
    out = {}
    for lane in mix.lanes:
        got = journaled.lanes.get(lane.key)
        mine = [p for p in order if claimed.get(p.id) == lane.cell.name and splits[p.id] == lane.split]
        chain_list = conversations.chains(mine, lane.cell.plan)
        lane_ids = {g for c in chain_list for g in c.ids()}
        left = conversations.left(chain_list, journaled.ids, errored[lane.cell.name] & lane_ids)
        acc = LaneAccount(lane, tokens=got.tokens if got else 0, records=got.records if got else 0, prompts=mine,
                          chains=chain_list, left=left, errors=len(errored[lane.cell.name] & lane_ids),
                          generated_tokens=got.generated_tokens if got else 0,
                          dropped=dict(got.dropped) if got else {})
        acc.exhausted = left.to_ask <= 0 and not pool[lane.split]  # nothing left to ask, met or not
        out[lane.key] = acc
    return out, pool

