"""Budget status of one dataset: what the journal holds against what the prompts offer."""

import os
import time

from . import formats, journal


def compute_status(dataset, journal_path, errors_path, prompts_path, on_bad_line="error"):
    state = journal.scan(journal_path)
    errored = journal.scan(errors_path).ids
    prompt_ids = {p.id for p in formats.load_prompts(prompts_path, on_bad_line=on_bad_line).prompts}
    remaining = len(prompt_ids - state.ids - errored)
    return {
        "dataset": dataset,
        "tokens": state.tokens,
        "responses": state.records,
        "errors": len(errored),
        "prompts": len(prompt_ids),
        "remaining_prompts": remaining,
        "exhausted": remaining == 0,
        "journal_bytes": os.path.getsize(journal_path) if os.path.exists(journal_path) else 0,
        "checked_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def budget_state(tokens, budget, exhausted):
    """met (tokens >= budget), exhausted (no prompt left, budget not met), or partial."""
    if tokens >= budget:
        return "met"
    return "exhausted" if exhausted else "partial"
