"""results/summary.tsv: per dataset prompts, responses, tokens, budget, state and length stats, and the
conversations (budgetgen.conversations): how many, finished, ended by an error, tokens per turn index."""

import os

from . import conversations, journal, prompts
from .state import budget_state

COLUMNS = ["dataset", "prompts", "responses", "completion_tokens", "token_budget", "budget_pct", "status",
           "mean_length", "p50_length", "p95_length", "cut_at_max_tokens_pct", "errors", "tokenized_rows",
           "tokenize_skipped", "conversations", "conversations_finished", "conversations_ended_by_error",
           "tokens_per_turn"]


def percentile(sorted_values, q):
    if not sorted_values:
        return 0
    i = min(len(sorted_values) - 1, max(0, int(round(q / 100.0 * (len(sorted_values) - 1)))))
    return sorted_values[i]


def dataset_row(dataset, raw_path, budget, prompts_path, errors_path, tokenized_path=None, plan=None, accepts=None):
    """One row; `plan`: the dataset's generation plan (default: turns last, one sample); `accepts(sha)`:
    whether errors of a generation identity count (identity.Policy.accepts; every one by default)."""
    lengths, cut, answered, per_turn = [], 0, set(), {}
    for _, rec in journal.iter_records(raw_path):
        n = int((rec.get("usage") or {}).get("completion_tokens") or 0)
        lengths.append(n)
        cut += rec.get("finish_reason") == "length"
        answered.add(str(rec["id"]))
        turn = conversations.record_place(rec["id"], rec)[1]
        per_turn[turn] = per_turn.get(turn, 0) + n
    prompt_list = prompts.load_prompts(prompts_path, on_bad_line="skip").prompts
    n_prompts = len(prompt_list)
    chain_list = conversations.chains(prompt_list, plan or conversations.Plan())
    samples = (plan or conversations.Plan()).samples
    errored = set().union(*(ids for sha, ids in journal.errors_by_identity(errors_path, samples).items()
                            if accepts is None or accepts(sha)))
    # generations that failed permanently and were not answered later (under other settings)
    errors = len(errored - answered)
    left = conversations.left(chain_list, answered, errored)
    tokens = sum(lengths)
    lengths.sort()
    status = budget_state(tokens, budget, exhausted=left.to_ask == 0)
    rows, skipped = "", ""
    if tokenized_path and os.path.exists(tokenized_path):
        import json

        import pyarrow as pa

        with pa.memory_map(tokenized_path) as src:
            reader = pa.ipc.open_stream(src)
            meta = json.loads((reader.schema.metadata or {}).get(b"budgetgen", b"{}"))
            rows = sum(b.num_rows for b in reader)
        # records tokenize could not make into rows, per reason (tokenization's skip reasons)
        skipped = ";".join(f"{k}={v}" for k, v in sorted((meta.get("skipped") or {}).items())) or "0"
    n = len(lengths)
    return {
        "dataset": dataset, "prompts": n_prompts, "responses": n, "completion_tokens": tokens,
        "token_budget": budget, "budget_pct": f"{100.0 * tokens / budget:.2f}", "status": status,
        "mean_length": f"{tokens / n:.1f}" if n else "0", "p50_length": percentile(lengths, 50),
        "p95_length": percentile(lengths, 95), "cut_at_max_tokens_pct": f"{100.0 * cut / n:.2f}" if n else "0.00",
        "errors": errors, "tokenized_rows": rows, "tokenize_skipped": skipped, "conversations": len(chain_list),
        "conversations_finished": len(chain_list) - left.chains_open - left.chains_ended_by_error,
        "conversations_ended_by_error": left.chains_ended_by_error,
        "tokens_per_turn": ";".join(f"{t}:{per_turn[t]}" for t in sorted(per_turn)) or "0",
    }


def format_tsv(rows):
    out = ["\t".join(COLUMNS)]
    out += ["\t".join(str(r[c]) for c in COLUMNS) for r in rows]
    return "\n".join(out) + "\n"
