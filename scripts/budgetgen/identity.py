"""One identity for how a generation was made, and what a settings change does to a journal.

The identity of a generation is every setting that shapes its content (`settings_of`):

  model                the served model (server.model, what each request names)
  max_tokens, temperature, top_p, extra_body
                       every request parameter, extra_body with its chat_template_kwargs
                       (enable_thinking, reasoning_effort, ...) and any sampling seed in it
  turns                last | all (budgetgen.conversations)
  history_reasoning    drop | keep; under turns: all only (with turns: last no history is sent back)
  samples_per_prompt

Its `sha` is the first 16 hex digits of the SHA-256 of those settings as canonical JSON. Every journal
and error record stores both, `"identity": SHA` right after its id (so a scan reads it from the line's
head) and `"identity_settings": {...}` (readable). Settings that change how fast or how robustly data
is made, or how much of it (budget, concurrency, timeouts, endpoints, progress, the dispatch-order
seed), never change it.

Records written before identities existed carry none: every reader refuses them in one line naming
scripts/migrate_journal.py (budgetgen.migration), which stamps each with the identity its params imply
(`legacy_identity`: params hold the request parameters, and under turns: all the turns and
history_reasoning; a record with a `sample` field was made with several samples per prompt, taken to
be the configured number when that is above one). So upgrading regenerates nothing.

A journal holding records of another identity than the current one is a settings change, decided by
`generation.on_settings_change` (`Policy`):

  refuse      (default) refused before any request, in one line naming each setting that differs
              (old -> new) and the ways out; unless the journal already holds records of the
              current identity (the change was decided earlier, e.g. by a regenerate run);
  regenerate  the old records stay in the journal (never deleted) but out of every count and
              output; generations are made afresh under the current identity, the budget counted
              afresh;
  extend      the old records stay in the outputs and count toward the budget; what is missing is
              generated under the current identity; each row carries its own identity.

Which identities count (`Policy.accepted`): the current one, or (extend) every one. Budget, status,
resume, "exhausted", finalize and tokenize all count through it. A journal with only error records
has nothing to refuse: errors hold only under the identity that produced them.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .errors import UserError

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from typing import Any

    from .conversations import Plan

POLICIES = ("refuse", "regenerate", "extend")
SHA_LEN = 16
UNKNOWN_SAMPLES = "several (written before identities)"

# The one list of content keys: settings that change what a dataset's data is (not how fast or how
# robustly it is made). The generation identity is the part of them that shapes each generation
# (settings_of); all of them are the inference rule's rerun trigger (settings.content_settings) and the
# content key (content_key) recorded in tokenized.arrow. Tokenizer keys: those that change the rows
# (processes only changes the speed; the forecast keys only the summary).
CONTENT_GENERATION_KEYS = ("token_budget", "max_tokens", "temperature", "top_p", "seed", "extra_body", "turns",
                           "history_reasoning", "samples_per_prompt", "on_settings_change", "mixture", "validation",
                           "thinking_budget")
CONTENT_TOKENIZER_KEYS = ("path", "max_length", "allow_mixed_settings", "use_server_token_ids",
                          "trust_remote_code", "reasoning_tags", "max_skipped_pct")


@dataclass
class IdentityCount:
    """The records of one generation identity in a journal (budgetgen.journal counts them), and its
    settings."""

    records: int = 0
    tokens: int = 0
    settings: dict | None = None
    cell: str | None = None  # the mixture cell its first record names (budgetgen.mixture)


def _canonical(obj):
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def request_params(model: str, max_tokens: int, temperature: float | None = None, top_p: float | None = None,
                   extra_body: dict[str, Any] | None = None, thinking_budget: int | None = None) -> dict[str, Any]:
    """The request parameters that affect content, as journaled with every response and error (each
    record's `params`): {"model", "max_tokens", "temperature"?, "top_p"?, "extra_body"?, "thinking_budget"?},
    unset values
    left out. A permanent error is tied to the parameters that produced it, so changing a content
    setting (say a lower max_tokens after HTTP 400 "max_tokens too large") makes its prompt eligible again."""
    p = {"model": model, "max_tokens": int(max_tokens)}
    if temperature is not None:
        p["temperature"] = temperature
    if top_p is not None:
        p["top_p"] = top_p
    if extra_body:
        p["extra_body"] = extra_body
    if thinking_budget is not None:
        p["thinking_budget"] = int(thinking_budget)
    return p


def _request_settings(params):
    """The request parameters of a record's or a run's params, numbers spelled one way (1 and 1.0 are
    one temperature)."""
    s = {k: params[k] for k in ("model", "max_tokens") if params.get(k) is not None}
    for k in ("temperature", "top_p"):
        if params.get(k) is not None:
            s[k] = float(params[k])
    if params.get("extra_body"):
        s["extra_body"] = params["extra_body"]
    if params.get("thinking_budget") is not None:
        s["thinking_budget"] = int(params["thinking_budget"])
    return s


def settings_of(params: Mapping[str, Any], plan: Plan) -> dict[str, Any]:
    """The readable identity settings of the request `params` (request_params: model,
    max_tokens, temperature?, top_p?, extra_body?) under the generation `plan` (conversations.Plan)."""
    s = _request_settings(params)
    s["turns"] = plan.turns
    if plan.turns == "all":
        s["history_reasoning"] = plan.history_reasoning
    s["samples_per_prompt"] = plan.samples
    return s


def sha_of(settings: dict[str, Any]) -> str:
    """The identity sha: the first 16 hex digits of the SHA-256 of the settings as canonical JSON."""
    return hashlib.sha256(_canonical(settings).encode()).hexdigest()[:SHA_LEN]


def gates_sha(gates: Iterable[tuple[str, Mapping[str, Any]]]) -> str:
    """The quality sha of a dataset: its cells' quality gates ((name, Gate.describe()), ...)."""
    return sha_of({"quality": [[name, dict(g)] for name, g in gates]})


def layout_sha(cells: Iterable[tuple[str, str]], validation_share: float, seed: int) -> str:
    """The layout sha of a mixture: what its lanes' counts depend on besides the budget, the cells'
    identities ((name, identity sha), ...) and the validation split (its share, and the seed that
    draws it)."""
    blob = {"cells": [[name, sha] for name, sha in cells], "validation_share": validation_share,
            "seed": seed if validation_share > 0 else None}
    return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()[:SHA_LEN]


def content_key(content: dict[str, Any] | None) -> str:
    """The content key: the SHA-256 of a dataset's content settings (settings.content_settings) as
    stable JSON (key order and number spelling do not matter), recorded in tokenized.arrow."""
    return hashlib.sha256(json.dumps(content or {}, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


@dataclass(frozen=True)
class Identity:
    """How a generation is made: its readable settings (as canonical JSON, so the object is hashable)
    and their sha."""

    settings_json: str
    sha: str

    @classmethod
    def of(cls, settings: dict[str, Any]) -> Identity:
        return cls(_canonical(settings), sha_of(settings))

    @property
    def settings(self) -> dict[str, Any]:
        return json.loads(self.settings_json)


def legacy_identity(record: Mapping[str, Any], configured_samples: int = 1) -> Identity:
    """The identity of a record written before records stored one: the one its params imply."""
    params = record.get("params") if isinstance(record.get("params"), dict) else {}
    settings = _request_settings(params)
    settings["turns"] = params.get("turns", "last")
    if settings["turns"] == "all":
        settings["history_reasoning"] = params.get("history_reasoning", "drop")
    if "sample" in record:
        settings["samples_per_prompt"] = configured_samples if configured_samples > 1 else UNKNOWN_SAMPLES
    else:
        settings["samples_per_prompt"] = 1
    return Identity.of(settings)


def record_sha(record: Mapping[str, Any], where: str) -> str:
    """The identity sha a parsed journal or error record stores. A record without one (written before
    identities) is refused in one line naming the migration (budgetgen.migration), `where` its FILE:LINE."""
    sha = record.get("identity")
    if isinstance(sha, str) and sha:
        return sha
    raise UserError(legacy_line(where))


MIGRATE_COMMAND = "python scripts/migrate_journal.py --config CONFIG --dataset {dataset}"


def legacy_line(where: str) -> str:
    """The one line a reader says of a record without an identity at `where` (FILE:LINE): the migration
    that stamps it (budgetgen.migration)."""
    path = where.rsplit(":", 1)[0]
    dataset = os.path.basename(os.path.dirname(os.path.abspath(path))) or "D"
    return (f"{where}: a record written before generation identities (no \"identity\"): migrate the dataset's "
            f"journal once with `{MIGRATE_COMMAND.format(dataset=dataset)}` (nothing is regenerated), then rerun")


def record_settings(record: Mapping[str, Any]) -> dict[str, Any] | None:
    """The readable settings a record stores with its identity."""
    settings = record.get("identity_settings")
    return settings if isinstance(settings, dict) else None


def differences(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """`key old -> new` for each setting that differs between two readable settings (nested keys of
    extra_body spelled with dots), in a stable order."""
    def flat(d, prefix=""):
        out = {}
        for k, v in d.items():
            if isinstance(v, dict) and v:
                out.update(flat(v, f"{prefix}{k}."))
            else:
                out[f"{prefix}{k}"] = v
        return out

    a, b = flat(old), flat(new)
    show = lambda v: "unset" if v is None else json.dumps(v, ensure_ascii=False)  # noqa: E731
    return [f"{k} {show(a.get(k))} -> {show(b.get(k))}" for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k)]


@dataclass(frozen=True)
class Policy:
    """generation.on_settings_change under the current identities: which identities count.

    A dataset of one cell has one current identity; a mixture (budgetgen.mixture) one per cell, `cells`
    ((name, Identity), ...) in config order, `current` the first. `layout`: the sha of the dataset's
    lanes (cells, validation split) when it is not one plain cell; counts made under another layout
    are not trusted (a prompt's split or cell may differ). `quality`: the sha of the cells' quality
    gates (gates_sha): counts of kept tokens made under other gates are not trusted either."""

    current: Identity
    on_change: str = "refuse"
    cells: tuple = ()
    layout: str | None = None
    quality: str | None = None

    @property
    def identities(self) -> tuple[tuple[str, Identity], ...]:
        """((cell name, Identity), ...): the cells now (one, `default`, for a dataset without a mixture)."""
        return self.cells or (("default", self.current),)

    @property
    def shas(self) -> frozenset[str]:
        return frozenset(i.sha for _, i in self.identities)

    def accepts(self, sha: str) -> bool:
        return self.on_change == "extend" or sha in self.shas

    def key(self) -> dict[str, str | None]:
        """What the status and the done marker record: counts made under another key are not trusted. The
        identity (of the first cell), for a mixture the layout sha of its lanes (layout_sha), the gates'."""
        return {"identity": self.current.sha, "layout": self.layout, "on_settings_change": self.on_change,
                "quality": self.quality}

    def cell_of(self, sha: str, named: str | None = None) -> str:
        """The cell a record of identity `sha` belongs to: the cell of that identity now; else (extend)
        the cell its records name (`named`) when that cell still exists, else the first cell."""
        for name, ident in self.identities:
            if ident.sha == sha:
                return name
        names = [n for n, _ in self.identities]
        return named if named in names else names[0]

    def changes(self, by_identity: Mapping[str, IdentityCount]) -> list[str] | None:
        """The settings that differ (`key old -> new`; `cell C: key old -> new` in a mixture) when the
        journal's records (`by_identity`: {sha: journal.IdentityCount}) were made under other settings
        and this policy refuses that, else None (nothing to refuse: regenerate or extend, no records of
        other settings, or records of the current settings of their cell already there)."""
        if self.on_change != "refuse":
            return None
        mine = dict(self.identities)
        held = lambda sha: by_identity.get(sha) is not None and by_identity[sha].records > 0  # noqa: E731
        refused = []
        for sha, c in by_identity.items():
            if sha in self.shas or not c.records:
                continue
            cell = getattr(c, "cell", None)
            if cell in mine and len(mine) > 1:
                if not held(mine[cell].sha):
                    refused.append((c, cell))
            elif not any(held(i.sha) for i in mine.values()):
                refused.append((c, None))
        if not refused:
            return None
        most, cell = max(refused, key=lambda cc: cc[0].records)
        old = most.settings or {}
        if cell is None:  # the cell now closest to the old settings
            cell = min(mine, key=lambda n: len(differences(old, mine[n].settings)))
        prefix = f"cell {cell}: " if len(mine) > 1 else ""
        return [prefix + d for d in differences(old, mine[cell].settings)] or [prefix + "settings differ"]

    def refusal(self, dataset: str, by_identity: Mapping[str, IdentityCount]) -> str | None:
        """The one-line refusal of a settings change (see changes()), or None."""
        changed = self.changes(by_identity)
        if changed is None:
            return None
        held = sum(c.records for sha, c in by_identity.items() if sha not in self.shas)
        return (f"dataset {dataset}: its journal holds {held} records made under other generation settings "
                f"({'; '.join(changed)}); nothing was requested. Restore those settings, use a new dataset name, "
                "or set generation.on_settings_change: regenerate (old records kept in the journal, out of the "
                "outputs; the budget counted afresh) or extend (old records kept in the outputs, the new settings "
                "fill the rest of the budget)")
