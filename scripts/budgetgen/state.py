"""A dataset's state, defined once: fresh, partial, met or exhausted.

Used at DAG time by rules/common.smk (which inputs finalize needs, the status table `snakemake -n`
prints), by the status checkpoint, the inference job and the summary, so that "met" and "exhausted"
mean the same thing everywhere:

  met        the journaled completion tokens reach the budget in the config *now*;
  exhausted  not met, and no generation is left to ask: every generation (a prompt's, or each turn and
             sample of it: budgetgen.conversations) is journaled or was ended by a permanent error
             under the request parameters the next job would send, the prompts file has not changed
             and the generation plan is the one that was counted under;
  partial    neither, with something journaled;
  fresh      nothing journaled yet.

The files read: the done marker the inference job writes when it finishes (results/D/inference.done,
absent while a job runs or after an interrupted one), the status checkpoint's output
(results/D/budget_status.json, whose counts may be stale but only ever too low) and the journal.
"""

import json
import os
from dataclasses import dataclass

from .conversations import DEFAULT_PLAN_KEY

FRESH, PARTIAL, MET, EXHAUSTED = "fresh", "partial", "met", "exhausted"


@dataclass(frozen=True)
class DatasetFiles:
    """Where one dataset's state lives."""

    journal: str
    done: str
    status: str
    prompts: str


def budget_state(tokens, budget, exhausted):
    """met (tokens >= budget), exhausted (no prompt left, budget not met), or partial."""
    if tokens >= budget:
        return MET
    return EXHAUSTED if exhausted else PARTIAL


def exhausted_under(status, params_sha):
    """Whether a status (status.compute_status) leaves no prompt to ask under the request parameters
    `params_sha`: each unanswered prompt failed permanently under exactly those parameters (errors
    under other settings make their prompts eligible again)."""
    remaining = int(status.get("remaining_prompts", 0))
    errored = status.get("errored_by_params")
    if errored is None:  # written before errors were tied to settings: trust its own verdict
        return bool(status.get("exhausted"))
    return remaining - int(errored.get(params_sha, 0)) <= 0


def decide(done, status, budget, params_sha, prompts_changed, journal_exists, plan_key=None):
    """The state from what is known (pure): the done marker's content (or None), the status (or None),
    the budget and request parameters now, whether the prompts changed since the status was written,
    whether a journal exists, the generation plan now (Plan.key(); a status counted under another
    plan never says exhausted). Returns (state, the info the state was read from)."""
    if done is not None:
        return budget_state(done.get("tokens", 0), budget, done.get("state") == EXHAUSTED), done
    if status is None:
        return (PARTIAL if journal_exists else FRESH), {}
    same_plan = status.get("plan", DEFAULT_PLAN_KEY) == (plan_key or DEFAULT_PLAN_KEY)
    exhausted = exhausted_under(status, params_sha) and not prompts_changed and same_plan
    state = budget_state(status["tokens"], budget, exhausted)
    if state == PARTIAL and not status["tokens"] and not journal_exists:
        state = FRESH
    return state, status


def read_json(path):
    """A JSON file's object, or None if it is missing or unreadable."""
    try:
        with open(path) as f:
            return json.load(f)
    except (FileNotFoundError, ValueError):
        return None


def prompts_changed_since(prompts, path):
    """Whether the prompts file is newer than `path` (or gone: an imported prompts file removed is
    imported again, so it counts as changed)."""
    if not os.path.exists(prompts):
        return True
    return os.path.getmtime(prompts) > os.path.getmtime(path)


def dataset_state(files, budget, params_sha, status=None, plan_key=None):
    """decide() on the dataset's files; `status` overrides reading files.status (the checkpoint's
    output as Snakemake hands it over)."""
    status = status if status is not None else read_json(files.status)
    changed = status is not None and prompts_changed_since(files.prompts, files.status)
    return decide(read_json(files.done) if os.path.exists(files.done) else None, status, budget, params_sha,
                  changed, os.path.exists(files.journal), plan_key)


def finalize_from_journal(files, budget, params_sha, status, plan_key=None):
    """Whether finalize reads the journal directly (met or exhausted per the checkpoint: no inference
    job), rather than waiting for the inference job's done marker."""
    if os.path.exists(files.done) or not os.path.exists(files.journal):
        return False
    state, _ = dataset_state(files, budget, params_sha, status, plan_key)
    return state in (MET, EXHAUSTED)


def status_row(name, files, budget, params_sha, scan_journal, plan_key=None):
    """One row of the status table: (name, tokens, budget, left, responses, state, read_now); responses
    are journal records, one per generation (per turn with turns: all). When no job has finished
    since the journal last grew (no done marker, the status older than the journal), the journal is
    counted now with `scan_journal(path) -> (tokens, records)`."""
    state, info = dataset_state(files, budget, params_sha, plan_key=plan_key)
    read_now = False
    if not os.path.exists(files.done) and os.path.exists(files.journal):
        if os.path.getsize(files.journal) != info.get("journal_bytes"):
            tokens, records = scan_journal(files.journal)
            info = {**info, "tokens": tokens, "responses": records}
            read_now = True
            if state in (FRESH, PARTIAL, MET) and tokens >= budget:
                state = "met (journal; not finalized)"
    tokens = int(info.get("tokens", 0))
    return name, tokens, budget, max(0, budget - tokens), int(info.get("responses", 0)), state, read_now


def format_status_table(rows):
    """The table `snakemake -n` prints, one `budgetgen: ` line per dataset."""
    width = max(len("dataset"), *(len(r[0]) for r in rows))
    lines = [f"budgetgen: {'dataset':<{width}}  {'tokens':>12}  {'budget':>12}  {'left':>12}  {'responses':>9}  state"]
    for name, tokens, budget, left, responses, state, _ in rows:
        lines.append(f"budgetgen: {name:<{width}}  {tokens:>12}  {budget:>12}  {left:>12}  {responses:>9}  {state}")
    read_now = [r[0] for r in rows if r[6]]
    lines.append("budgetgen: (token counts as of the last finished job, or read from the journal now where a "
                 "later run wrote to it: " + (", ".join(read_now) or "none") + ")")
    return "\n".join(lines)


def looks_local(name):
    """Whether a tokenizer path names a local folder (not a hub id `org/model`)."""
    name = os.fspath(name)
    return os.path.isabs(name) or name.startswith(".") or name.count("/") > 1 or os.path.exists(name)
