"""Budget status of one dataset (the checkpoint's output): what the journal holds against what the
prompts offer, under the generation settings now. What the status means for the dataset's state is
budgetgen.state's to decide."""

import os
import time

from . import conversations, journal, prompts


def compute_status(s):
    """The status of the dataset of `s` (settings.DatasetSettings), counted in generations (one per
    prompt with turns: last and one sample; one per turn and sample otherwise; budgetgen.conversations),
    of the identities that count (budgetgen.identity.Policy): remaining_prompts: generations not
    journaled; errored: how many of those a permanent error under the current identity ended;
    exhausted: none left; refused: the one-line refusal of a settings change, or None, and
    settings_changed: what changed (`key old -> new`); identity and
    on_settings_change: what these counts were made under (budgetgen.state trusts them under those only);
    identities: every identity in the journal, its records and tokens (counted or not)."""
    policy, plan = s.policy, s.plan
    state = journal.scan(s.paths.journal, accepts=policy.accepts, samples=plan.samples)
    errored_ids = journal.errors_by_identity(s.paths.errors, plan.samples).get(policy.current.sha, set())
    prompt_list = prompts.load_prompts(s.paths.prompts, on_bad_line=s.on_bad_line).prompts
    chain_list = conversations.chains(prompt_list, plan)
    left = conversations.left(chain_list, state.ids, errored_ids)
    return {
        "dataset": s.dataset,
        "tokens": state.tokens,
        "responses": state.records,
        "errors": len(errored_ids),
        "prompts": len(prompt_list),
        "conversations": len(chain_list),
        "remaining_prompts": left.remaining,
        "errored": left.blocked,
        "exhausted": left.to_ask <= 0,
        "refused": policy.refusal(s.dataset, state.by_identity),
        "settings_changed": policy.changes(state.by_identity),
        **policy.key(),
        "identities": {sha: {"records": c.records, "tokens": c.tokens} for sha, c in state.by_identity.items()},
        "journal_bytes": os.path.getsize(s.paths.journal) if os.path.exists(s.paths.journal) else 0,
        "checked_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
