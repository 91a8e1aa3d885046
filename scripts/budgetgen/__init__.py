"""budgetgen: budgeted response generation for speculative-decoding draft training data.

One module per concern:
  errors       UserError, the one-line error every entry point prints (at the ground: imports nothing)
  entry        how an entry point runs: command line or Snakemake script (argv, log, one-line error, cause)
  failures     a failed job's one-line cause, recorded by the job and said last by onerror
  fsutil       atomic writes
  paths        where a dataset's files live (DatasetPaths)
  configcheck  config checks the Snakefile runs before any job (duplicate keys, schema errors, files, budgets)
  settings     typed settings built once from the validated config (defaults only from the schema)
  configfile   the config file read outside Snakemake (load_config, --config FILE --dataset D)
  template_check  chat_template_kwargs against the target's chat template (keys it reads, cells that differ)
  migration    journals written before identities: refused in one line, stamped once (migrate_journal.py)
  identity     every fingerprint (identity, layout, content key), the content keys, what a settings change does
  mixture      mixture cells and the validation split: lanes, budget lines, how prompts are claimed
  quality      the quality gate: a response's facts (its journaled flags) and each cell's keep/flag/drop
  degenerate   degenerate output a broken server sends with HTTP 200: loops, U+FFFD, leaked special tokens
  breaker      per endpoint, its last responses' server faults: a server gone bad cut off, its responses blamed
  canary       questions with known answers asked of every endpoint before the bulk run (server.canary)
  forecast     the storage forecast of an EAGLE-3 hidden-state dump (from the model's config.json)
  prompts      prompts.jsonl parsing (OpenAI / ShareGPT / prompt / instruction), stable ids, dispatch order
  prompts_check  every prompts file read at parse time: its first bad line, worker processes, a cache
  conversations  how prompts become generations: turns, samples, their ids, history, what is left
  sources      prompt sets from Hugging Face `datasets` sources, imported as a prompts.jsonl
  journal      the append-only response journal and errors.jsonl: the format, every reader, the blame file
  journal_follow  JournalFollower: a journal read incrementally while a run appends (watch)
  journal_write  writing them: record, line, lock, writer, torn-tail repair (journal re-exports them)
  budget       the dispatch rule that stops at the token budget
  lengths      the completion-length model the rule reads (what a request in flight will count)
  engines      engines as dialects: each released server's chat-stream fields, the only module naming them
  client       async httpx OpenAI chat client: endpoints, the watchdog, the server check
  streams      one chat stream over HTTP: its chunks, tokens in flight, the result or error class
  stream_workers  the streams read in worker processes (server.client_processes); the job journals
  processes    how many processes a job runs: its usable CPUs (affinity), its stream workers
  launch       a server started by the inference job itself (server.launch): start, wait, stop
  cluster      what an inference job asks a cluster for, by server mode; the profile's checks
  endpoints    the servers behind one client: pool, failover, the watchdog, the model check
  plan         what an inference job finds and has left to ask: prepare(), RunState, the dispatch order
  progress     StreamProgress, rates, the progress lines (log, terminal; shared with watch)
  retries      one request's attempts, permanent errors held until proved the prompts', prove_server
  inference    the dispatch loop tying plan, budget, client and journal together
  outcome      how a job ends: met/exhausted/partial (the done marker), a signal, responses that are not data
  status       budget status of a dataset (the checkpoint's content)
  estimate     what the remaining work costs before it starts: wall time, GPU-hours, storage (-n prints it)
  state        a dataset's state (fresh, partial, met, exhausted, refused), defined once
  turn_format  the tokenizer loaded and its template probed: end-of-turn token, reasoning delimiters
  chat_render  the chat template rendered as the engines render it (content parts, compiled + checked)
  rows         training rows: prompt + completion ids and loss masks (server ids or the text fallback)
  raw_records  raw_responses.jsonl read one way: a validated record, its split and cell
  usage_check  rows built from text against the server's usage: a wrong tokenizer, parser or template refused
  tokenization the tokenize job's file driver: batches, worker pool, Arrow output with provenance
  tokenize_counts  what a tokenized file's batches add up to: counts, refusal, provenance, summary line
  export       the layouts draft-model trainers read (SpecForge, pre-tokenized JSON Lines, HF dataset)
  summary      results/summary.tsv
  plots        the report's figures of one dataset (data functions + matplotlib drawing)
  watch        the read-only view of a working directory behind scripts/watch.py

Test tooling (the mock server, the tiny tokenizer) is the separate package budgetgen_testkit, which
depends on this one, never the reverse.
"""

__version__ = "0.1.0"
