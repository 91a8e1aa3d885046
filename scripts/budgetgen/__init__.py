"""budgetgen: budgeted response generation for speculative-decoding draft training data.

One module per concern:
  errors      UserError, the one-line error every entry point prints
  fsutil      atomic writes
  formats     prompts.jsonl parsing (OpenAI / ShareGPT / prompt / instruction), stable ids
  journal     the append-only response journal: scan, torn-tail repair, lock, append
  budget      completed-length model and the dispatch rule that stops at the token budget
  client      async httpx OpenAI chat client: streaming, retry classes, health check
  inference   the dispatch loop tying prompts, budget, client and journal together
  status      budget status of a dataset (the checkpoint's content)
  tokenization chat-template rendering, loss masks, Arrow output
  summary     results/summary.tsv
  plots       the report's figures of one dataset (data functions + matplotlib drawing)
  mock_server a stdlib OpenAI-compatible server for the demo, tests and benchmarks
"""

__version__ = "0.1.0"
