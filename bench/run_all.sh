#!/usr/bin/env bash
# Set up (first use) and run every benchmark; each prints its table and writes bench/results/NAME.md.
#   bash bench/run_all.sh            the default sizes (about 35 min on 2 cores: occupancy alone 15)
#   bash bench/run_all.sh --quick    smoke sizes (a few minutes)
# Extra arguments go to every benchmark (--quick is understood by all of them).
set -euo pipefail
cd "$(dirname "$0")/.."
bash bin/setup
.venv/bin/python -m pip install -q -r bench/requirements.txt
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
start=$SECONDS
times=()
for b in budget decision occupancy client ingest tokenize resume dag estimate quality; do
  echo "=== bench_$b.py $*" >&2
  t0=$SECONDS
  .venv/bin/python "bench/bench_$b.py" "$@"
  times+=("bench_$b.py $((SECONDS - t0)) s")
done
printf '%s\n' "${times[@]}" "all: $((SECONDS - start)) s; tables: bench/results/*.md" >&2
