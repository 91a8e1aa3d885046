"""A dataset's state, defined once: fresh, partial, met or exhausted.

Used at DAG time by rules/common.smk (which inputs finalize needs, the status table `snakemake -n`
prints), by the status checkpoint, the inference job and the summary, so that "met" and "exhausted"
mean the same thing everywhere:

  met        the journaled completion tokens *of the identities that count* (budgetgen.identity: the
             generation settings now, and generation.on_settings_change) reach the budget in the config
             *now*, in every lane (budgetgen.mixture: each mixture cell in each split has its own budget
             line; a dataset without a mixture or validation split is one lane);
  exhausted  not met, and every lane not met has no generation left to ask: every generation (a
             prompt's, or each turn and sample of it: budgetgen.conversations) is journaled or was ended
             by a permanent error under the identity the next job would make, no unclaimed prompt of its
             split is left, and the prompts file has not changed;
  refused    the journal holds records made under other settings, and on_settings_change says refuse
             (the inference job refuses before any request, in one line);
  partial    none of these, with something journaled;
  fresh      nothing journaled yet.

Counts are trusted only under the identity and on_settings_change they were made under (the status's
and the done marker's `identity`, `on_settings_change`): counted under others they say nothing, so
the inference job runs and decides.

The files read: the done marker the inference job writes when it finishes (results/D/inference.done,
absent while a job runs or after an interrupted one), the status checkpoint's output
(results/D/budget_status.json, whose counts may be stale but only ever too low) and the journal.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence
    from typing import Any

    from .identity import Policy
    from .journal import JournalState

FRESH, PARTIAL, MET, EXHAUSTED, REFUSED = "fresh", "partial", "met", "exhausted", "refused"


@dataclass(frozen=True)
class DatasetFiles:
    """Where one dataset's state lives."""

    journal: str
    done: str
    status: str
    prompts: str


def budget_state(tokens: int, budget: int, exhausted: bool) -> str:
    """met (tokens >= budget), exhausted (no prompt left, budget not met), or partial."""
    if tokens >= budget:
        return MET
    return EXHAUSTED if exhausted else PARTIAL


def budget_lines(budget: int | dict[str, int]) -> dict[str, int]:
    """{lane key: budget} of a budget given as a number (one lane) or as mixture.Mixture.budgets()."""
    return dict(budget) if isinstance(budget, dict) else {"default": int(budget)}


def lanes_of(info: Mapping[str, Any], budget: int | dict[str, int]) -> dict[str, dict[str, Any]]:
    """{lane key: {"tokens", "budget", "exhausted"}} of a status or done marker under the budget now; one
    written before lanes (or by a one-lane dataset) gives its totals to its one lane. `exhausted`: no
    generation left to ask in the lane (whether or not it was met)."""
    budgets = budget_lines(budget)
    lanes = info.get("lanes")
    if not isinstance(lanes, dict):
        nothing_left = info["exhausted"] if "exhausted" in info else info.get("state") == EXHAUSTED
        lanes = {k: {"tokens": info.get("tokens", 0), "exhausted": bool(nothing_left)} for k in budgets}
    return {k: {"tokens": int((lanes.get(k) or {}).get("tokens", 0)), "budget": b,
                "exhausted": bool((lanes.get(k) or {}).get("exhausted"))} for k, b in budgets.items()}


def lanes_state(lanes: Mapping[str, Mapping[str, Any]]) -> str:
    """met (every lane met; or every lane met or with nothing left and the lanes' total met: the dataset's
    budget is, short_lanes() names the lanes short of their line), exhausted (every lane met or with
    nothing left, the total short), or partial."""
    if all(v["tokens"] >= v["budget"] for v in lanes.values()):
        return MET
    if all(v["tokens"] >= v["budget"] or v["exhausted"] for v in lanes.values()):
        met = sum(v["tokens"] for v in lanes.values()) >= sum(v["budget"] for v in lanes.values())
        return MET if met else EXHAUSTED
    return PARTIAL


def short_lanes(lanes: Mapping[str, Mapping[str, Any]]) -> str:
    """` (short: validation/think at 91.9 % of its line)`: the lanes of a met dataset that ran out of prompts
    before their own line, with their share of it; '' where none is."""
    short = [f"{k} at {100 * v['tokens'] / v['budget']:.1f} % of its line" for k, v in lanes.items()
             if v["budget"] and v["tokens"] < v["budget"]]
    return f" (short: {', '.join(short)})" if short else ""


def counted_under(info: Mapping[str, Any], policy_key: Mapping[str, Any]) -> bool:
    """Whether a status or done marker was counted under `policy_key` (identity.Policy.key()): written
    before identities, or under other settings, it is not."""
    return all(info.get(k) == v for k, v in policy_key.items())


def decide(done: dict[str, Any] | None, status: dict[str, Any] | None, budget: int | dict[str, int],
           policy_key: Mapping[str, Any], prompts_changed: bool, journal_exists: bool) -> tuple[str, dict[str, Any]]:
    """The state from what is known (pure): the done marker's content (or None), the status (or None),
    the budget now (a number, or {lane: budget} of a mixture: budget_lines) and the policy key now
    (identity.Policy.key()), whether the prompts changed since the status was written, whether a journal
    exists. Returns (state, the info the state was read from)."""
    if done is not None and counted_under(done, policy_key):
        return lanes_state(lanes_of(done, budget)), done
    if status is None or not counted_under(status, policy_key):
        return (PARTIAL if journal_exists else FRESH), {}
    if status.get("refused"):
        return REFUSED, status
    lanes = lanes_of(status, budget)
    if prompts_changed:
        for v in lanes.values():
            v["exhausted"] = False
    state = lanes_state(lanes)
    if state == PARTIAL and not status["tokens"] and not journal_exists:
        state = FRESH
    return state, status


def read_json(path: str | os.PathLike) -> Any:
    """A JSON file's object, or None if it is missing or unreadable."""
    try:
        with open(path) as f:
            return json.load(f)
    except (FileNotFoundError, ValueError):
        return None


def prompts_changed_since(prompts: str, path: str) -> bool:
    """Whether the prompts file is newer than `path` (or gone: an imported prompts file removed is
    imported again, so it counts as changed)."""
    if not os.path.exists(prompts):
        return True
    return os.path.getmtime(prompts) > os.path.getmtime(path)


def dataset_state(files: DatasetFiles, budget: int | dict[str, int], policy_key: Mapping[str, Any],
                  status: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
    """decide() on the dataset's files; `status` overrides reading files.status (the checkpoint's
    output as Snakemake hands it over)."""
    status = status if status is not None else read_json(files.status)
    changed = status is not None and prompts_changed_since(files.prompts, files.status)
    return decide(read_json(files.done) if os.path.exists(files.done) else None, status, budget, policy_key,
                  changed, os.path.exists(files.journal))


def finalize_from_journal(files: DatasetFiles, budget: int | dict[str, int], policy_key: Mapping[str, Any],
                          status: dict[str, Any] | None) -> bool:
    """Whether finalize reads the journal directly (met or exhausted per the checkpoint: no inference
    job), rather than waiting for the inference job's done marker."""
    if os.path.exists(files.done) or not os.path.exists(files.journal):
        return False
    state, _ = dataset_state(files, budget, policy_key, status)
    return state in (MET, EXHAUSTED)


def status_row(name: str, files: DatasetFiles, budget: int | dict[str, int], policy: Policy,
               scan_journal: Callable[[str, Policy], JournalState]) -> tuple[str, int, int, int, int, str, bool]:
    """One row of the status table: (name, tokens, budget, left, responses, state, read_now); responses
    are journal records of the identities that count (`policy`: identity.Policy), one per generation
    (per turn with turns: all). When no job has finished since the journal last grew, or the counts
    were made under other settings, the journal is counted now with `scan_journal(path, policy) ->
    JournalState`; a settings change the job would refuse shows as `refused (what changed)`. `budget`:
    a number, or {lane: budget} of a mixture (budget_lines)."""
    return status_rows(name, files, budget, policy, scan_journal)[0]


def status_rows(name: str, files: DatasetFiles, budget: int | dict[str, int], policy: Policy,
                scan_journal: Callable[[str, Policy], JournalState]) -> list[tuple[str, int, int, int, int, str, bool]]:
    """status_row, then (a dataset of several lanes: mixture cells, a validation split) a row per lane,
    named `D/CELL` or `D/CELL/validation`, with its own tokens, budget line and state."""
    budgets = budget_lines(budget)
    total = sum(budgets.values())
    key = policy.key()
    state, info = dataset_state(files, budgets, key)
    read_now = False
    lanes = lanes_of(info, budgets) if info else {k: {"tokens": 0, "budget": b, "exhausted": False}
                                                   for k, b in budgets.items()}
    responses = {k: int(((info.get("lanes") or {}).get(k) or {}).get("responses", 0)) for k in budgets}
    if not finalized(files, key) and os.path.exists(files.journal):
        if not info or os.path.getsize(files.journal) != info.get("journal_bytes"):
            found = scan_journal(files.journal, policy)
            info = {**info, "tokens": found.tokens, "responses": found.records}
            for k, v in lanes.items():
                got = found.lanes.get(k) if found.lanes else None
                v["tokens"] = got.tokens if got else (found.tokens if len(lanes) == 1 else 0)
                responses[k] = got.records if got else (found.records if len(lanes) == 1 else 0)
            read_now = True
            state = journal_state(state, policy.changes(found.by_identity), lanes_state(lanes) == MET,
                                  found.records > 0, done=False)
    if state == REFUSED:
        state = refused_state(info.get("settings_changed") or [])
    if state.startswith(MET) and len(lanes) > 1:
        state += short_lanes(lanes)
    tokens = int(info.get("tokens", 0))
    rows = [(name, tokens, total, max(0, total - tokens), int(info.get("responses", 0)), state, read_now)]
    if len(lanes) > 1:
        for k, v in lanes.items():
            lane = lanes_state({k: v}) if not state.startswith(REFUSED) else REFUSED
            if lane == PARTIAL and not v["tokens"] and not responses[k]:
                lane = FRESH  # nothing journaled in this lane yet
            rows.append((f"{name}/{k}", v["tokens"], v["budget"], max(0, v["budget"] - v["tokens"]), responses[k],
                         lane, read_now))
    return rows


MET_BY_JOURNAL = "met (journal; not finalized)"


def finalized(files: DatasetFiles, policy_key: Mapping[str, Any]) -> bool:
    """Whether the inference job's done marker is there and counted under `policy_key`."""
    done = read_json(files.done) if os.path.exists(files.done) else None
    return done is not None and counted_under(done, policy_key)


def journal_state(state: str, changed: Iterable[str] | None, met: bool, journaled: bool, done: bool) -> str:
    """The state decide() gave, corrected by the journal counted now (the status table and the watch
    view): settings `changed` that the job would refuse show as refused; every lane `met` by the
    journal without a done marker that counts (`done`: finalized()) as MET_BY_JOURNAL; fresh with
    records `journaled` as partial."""
    if changed:
        return refused_state(changed)
    if state in (FRESH, PARTIAL, MET) and met and not done:
        return MET_BY_JOURNAL
    if state == FRESH and journaled:
        return PARTIAL
    return state


def refused_state(changed: Iterable[str]) -> str:
    """The status table's state of a refused settings change: what changed, and where to decide."""
    return f"{REFUSED}: settings changed ({'; '.join(changed)}); see generation.on_settings_change"


def refused_before_jobs(refused: Mapping[str, str]) -> str | None:
    """The run's refusal, before any job starts (the Snakefile's onstart), of the datasets with jobs to run
    whose state is a refused settings change ({dataset: its status-table state}): one line each, and the
    ways out; no job ran, so nothing (journal, rows, exports, summary) was touched. None if there is none."""
    if not refused:
        return None
    lines = [f"dataset {ds}: {row_state}" for ds, row_state in sorted(refused.items())]
    lines.append("nothing was run and no output was removed. Restore those settings, use a new dataset name, or "
                 "set generation.on_settings_change: regenerate (old records kept in the journal, out of the "
                 "outputs; the budget counted afresh) or extend (old records kept in the outputs, the new "
                 "settings fill the rest of the budget)")
    return "\n".join(lines)


def format_status_table(rows: Sequence[tuple[str, int, int, int, int, str, bool]]) -> str:
    """The table `snakemake -n` prints, one `budgetgen: ` line per dataset."""
    width = max(len("dataset"), *(len(r[0]) for r in rows))
    lines = [f"budgetgen: {'dataset':<{width}}  {'kept tokens':>12}  {'budget':>12}  {'left':>12}  "
             f"{'responses':>9}  state"]
    for name, tokens, budget, left, responses, state, _ in rows:
        lines.append(f"budgetgen: {name:<{width}}  {tokens:>12}  {budget:>12}  {left:>12}  {responses:>9}  {state}")
    read_now = [r[0] for r in rows if r[6]]
    lines.append("budgetgen: (kept tokens: those the quality gate keeps, what the budget counts; responses: all "
                 "journaled; as of the last finished job, or read from the journal now where a "
                 "later run wrote to it: " + (", ".join(read_now) or "none") + ")")
    return "\n".join(lines)


def looks_local(name: str | os.PathLike) -> bool:
    """Whether a tokenizer path names a local folder (not a hub id `org/model`)."""
    name = os.fspath(name)
    return os.path.isabs(name) or name.startswith(".") or name.count("/") > 1 or os.path.exists(name)
