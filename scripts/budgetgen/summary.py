"""results/summary.tsv: per dataset prompts, responses, tokens, budget, state and length stats."""

import os

from . import journal, prompts
from .state import budget_state, prompts_left

COLUMNS = ["dataset", "prompts", "responses", "completion_tokens", "token_budget", "budget_pct", "status",
           "mean_length", "p50_length", "p95_length", "cut_at_max_tokens_pct", "errors", "tokenized_rows",
           "tokenize_skipped"]


def percentile(sorted_values, q):
    if not sorted_values:
        return 0
    i = min(len(sorted_values) - 1, max(0, int(round(q / 100.0 * (len(sorted_values) - 1)))))
    return sorted_values[i]


def dataset_row(dataset, raw_path, budget, prompts_path, errors_path, tokenized_path=None):
    lengths, cut, answered = [], 0, set()
    for _, rec in journal.iter_records(raw_path):
        lengths.append(int((rec.get("usage") or {}).get("completion_tokens") or 0))
        cut += rec.get("finish_reason") == "length"
        answered.add(str(rec["id"]))
    prompt_ids = {p.id for p in prompts.load_prompts(prompts_path, on_bad_line="skip").prompts}
    n_prompts = len(prompt_ids)
    errored = journal.scan(errors_path).ids
    # prompts that failed permanently and were not answered later (under other settings)
    errors = len(errored - answered)
    tokens = sum(lengths)
    lengths.sort()
    status = budget_state(tokens, budget, exhausted=prompts_left(prompt_ids, answered, errored) == 0)
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
        "errors": errors, "tokenized_rows": rows, "tokenize_skipped": skipped,
    }


def format_tsv(rows):
    out = ["\t".join(COLUMNS)]
    out += ["\t".join(str(r[c]) for c in COLUMNS) for r in rows]
    return "\n".join(out) + "\n"
