"""budgetgen_testkit: the stand-ins budgetgen is demonstrated, tested and benchmarked against.

Not part of the product: no rule, entry point of the workflow or module of `budgetgen` imports it. It
depends on `budgetgen` (errors, fsutil, and tokenization for --token-ids-tokenizer), never the reverse.

  mock_server     a stdlib OpenAI-compatible chat server: HTTP/1.1 + SSE, an engine simulator (time to
                  first token, token rate, slots, context limit), fault injection, /stats; `spawn`/`stop`
                  run it as a subprocess (scripts/mock_server.py is its command line)
  records  stamped(): a hand-built journal record with the identity its params imply, as the job writes it
  tiny_tokenizer  a tiny byte-level BPE tokenizer with a chat template (chatml, llama3, qwen3_strip), trained
                  locally and deterministically (scripts/make_demo_tokenizer.py is its command line)
"""
