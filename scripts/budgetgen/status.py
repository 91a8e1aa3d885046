"""Budget status of one dataset (the checkpoint's output): what the journal holds against what the
prompts offer. What the status means for the dataset's state is budgetgen.state's to decide."""

import os
import time

from . import conversations, journal, prompts
from .params import params_sha256


def compute_status(dataset, journal_path, errors_path, prompts_path, on_bad_line="error", plan=None):
    """Counted in generations (one per prompt with turns: last and one sample; one per turn and
    sample otherwise; budgetgen.conversations): remaining_prompts: generations not journaled;
    errored_by_params: how many of those a permanent error ended, per request-parameter hash
    (state.exhausted_under decides against the current ones); exhausted: none left even counting
    every recorded error (a display hint only); plan: the plan these counts were made under."""
    plan = plan or conversations.Plan()
    state = journal.scan(journal_path)
    by_params = errors_by_params(errors_path)
    prompt_list = prompts.load_prompts(prompts_path, on_bad_line=on_bad_line).prompts
    chain_list = conversations.chains(prompt_list, plan)
    remaining = conversations.left(chain_list, state.ids).remaining
    errored = {sha: conversations.left(chain_list, state.ids, ids).blocked for sha, ids in by_params.items()}
    return {
        "dataset": dataset,
        "tokens": state.tokens,
        "responses": state.records,
        "errors": len(set().union(*by_params.values())),
        "prompts": len(prompt_list),
        "conversations": len(chain_list),
        "remaining_prompts": remaining,
        "errored_by_params": {sha: n for sha, n in errored.items() if n},
        "exhausted": max(errored.values(), default=0) >= remaining,
        "plan": plan.key(),
        "journal_bytes": os.path.getsize(journal_path) if os.path.exists(journal_path) else 0,
        "checked_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


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
