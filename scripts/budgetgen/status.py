"""Budget status of one dataset (the checkpoint's output): what the journal holds against what the
prompts offer, under the generation settings now, per lane (budgetgen.mixture: each mixture cell in
each split). What the status means for the dataset's state is budgetgen.state's to decide."""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

from . import conversations, journal, mixture
from .errors import UserError

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any

    from .identity import Policy
    from .journal import JournalState
    from .prompts import Prompt
    from .settings import InferenceSettings


def scan_lanes(s: InferenceSettings, prompt_list: Sequence[Prompt] | None = None,
               repair: bool = False) -> JournalState:
    """The journal of `s` (settings.InferenceSettings) scanned with the records of the identities that
    count, per lane. `prompt_list`: the dataset's prompts, which a validation split needs to tell a
    record's split (loaded here when needed and not given)."""
    mix = s.mixture
    if prompt_list is None and mix.validation_share > 0:
        prompt_list = s.load_prompts().prompts
    return journal.scan(s.paths.journal, repair=repair, accepts=s.policy.accepts,
                        lane_of=mix.lane_of(s.policy, prompt_list), gate_of=mix.gate_of(s.policy))


def table_counts(s: InferenceSettings) -> Callable[[str, Policy], JournalState]:
    """status_rows' scan_journal for `snakemake -n`: scan_lanes, or (prompts unreadable at DAG time,
    their one line comes from the job) the counts without splits."""
    def count(path, policy):
        try:
            return scan_lanes(s)
        except UserError:
            return journal.scan(path, accepts=policy.accepts, lane_of=s.mixture.lane_of(policy, None),
                                gate_of=s.mixture.gate_of(policy))
    return count


def compute_status(s: InferenceSettings) -> dict[str, Any]:
    """The status of the dataset of `s` (settings.InferenceSettings), counted in generations (one per
    prompt with turns: last and one sample; one per turn and sample otherwise; budgetgen.conversations),
    of the identities that count (budgetgen.identity.Policy), per lane (`lanes`: each cell in each split,
    its budget, tokens, responses and whether it has nothing left to ask): remaining_prompts:
    generations not journaled; errored: how many of those a permanent error under the current identity
    ended; exhausted: none left in any lane; refused: the one-line refusal of a settings change, or None,
    and settings_changed: what changed (`key old -> new`); identity and on_settings_change: what these
    counts were made under (budgetgen.state trusts them under those only); identities: every identity
    in the journal, its records and tokens (counted or not)."""
    policy, mix = s.policy, s.mixture
    pset = s.load_prompts()
    state = scan_lanes(s, pset.prompts)
    errors = journal.errors_by_identity(s.paths.errors)
    lanes, pool = mixture.account(mix, policy, pset.prompts, state, errors)
    # unclaimed prompts counted as their split's first cell would make them
    first_plan = {lane.split: lane.cell.plan for lane in reversed(mix.lanes)}
    unclaimed = [c for split, ps in pool.items() for c in conversations.chains(ps, first_plan[split])]
    return {
        "dataset": s.dataset,
        "tokens": state.tokens,  # kept by the quality gate: what the budget counts
        "generated_tokens": state.generated_tokens,
        "dropped": dict(state.dropped),
        "responses": state.records,
        "errors": sum(a.errors for a in lanes.values()),
        "prompts": len(pset.prompts),
        "prompts_in_earlier_datasets": pset.in_earlier,
        "conversations": sum(len(a.chains) for a in lanes.values()) + len(unclaimed),
        "remaining_prompts": sum(a.left.remaining for a in lanes.values()) + sum(c.n_turns for c in unclaimed),
        "errored": sum(a.left.blocked for a in lanes.values()),
        "exhausted": all(a.exhausted for a in lanes.values()),
        "lanes": {k: a.summary() for k, a in lanes.items()},
        "refused": policy.refusal(s.dataset, state.by_identity),
        "settings_changed": policy.changes(state.by_identity),
        **policy.key(),
        "identities": {sha: {"records": c.records, "tokens": c.tokens} for sha, c in state.by_identity.items()},
        "journal_bytes": os.path.getsize(s.paths.journal) if os.path.exists(s.paths.journal) else 0,
        "checked_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
