"""Budget status of one dataset: what the journal holds against what the prompts offer."""

import os
import time

from . import formats, journal
from .params import params_sha256


def compute_status(dataset, journal_path, errors_path, prompts_path, on_bad_line="error"):
    """remaining_prompts: prompts not journaled; errored_by_params: how many of those failed
    permanently, per request-parameter hash (exhausted_under decides against the current ones);
    exhausted: no prompt left even counting every recorded error (a display hint only)."""
    state = journal.scan(journal_path)
    by_params = errors_by_params(errors_path)
    prompt_ids = {p.id for p in formats.load_prompts(prompts_path, on_bad_line=on_bad_line).prompts}
    unanswered = prompt_ids - state.ids
    errored = {sha: len(ids & unanswered) for sha, ids in by_params.items()}
    return {
        "dataset": dataset,
        "tokens": state.tokens,
        "responses": state.records,
        "errors": len(set().union(*by_params.values())),
        "prompts": len(prompt_ids),
        "remaining_prompts": len(unanswered),
        "errored_by_params": {sha: n for sha, n in errored.items() if n},
        "exhausted": max(errored.values(), default=0) >= len(unanswered),
        "journal_bytes": os.path.getsize(journal_path) if os.path.exists(journal_path) else 0,
        "checked_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def budget_state(tokens, budget, exhausted):
    """met (tokens >= budget), exhausted (no prompt left, budget not met), or partial."""
    if tokens >= budget:
        return "met"
    return "exhausted" if exhausted else "partial"


def errors_by_params(errors_path):
    """{params_sha256: ids} of the permanent errors in errors.jsonl, every record read (one id may have
    failed under several settings). An error holds only under the parameters that produced it."""
    found = {}
    if not os.path.exists(errors_path):
        return found
    with open(errors_path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.endswith("\n") or not line.strip():
                continue  # a torn tail: the inference job repairs it under its lock
            rid, _, rec = journal.parse_line(line, f"{errors_path}:{lineno}")
            found.setdefault(params_sha256(rec.get("params")), set()).add(rid)
    return found


def exhausted_under(status, params_sha):
    """Whether no prompt is left to ask under the request parameters `params_sha`: every prompt is
    journaled or failed permanently under exactly those parameters (errors under other settings
    make their prompts eligible again)."""
    remaining = int(status.get("remaining_prompts", 0))
    errored = status.get("errored_by_params")
    if errored is None:  # written before errors were tied to settings: trust its own verdict
        return bool(status.get("exhausted"))
    return remaining - int(errored.get(params_sha, 0)) <= 0
