#!/usr/bin/env bash
# Set up (first use) and run the workflow on the bundled demo: a local mock OpenAI-compatible
# server on 127.0.0.1, a tokenizer built locally, four small prompt sets (one a thinking-on/off mixture
# with a validation split).
# Extra arguments go to snakemake (e.g. ./run_demo.sh -n).
set -euo pipefail
cd "$(dirname "$0")"
bash bin/setup
export PATH="$PWD/.venv/bin:$PATH" HF_HUB_OFFLINE=1 HF_HUB_DISABLE_UPDATE_CHECK=1
PORT=${BUDGETGEN_DEMO_PORT:-18765}
python scripts/make_demo_tokenizer.py demo/tokenizer --corpus demo/prompts/*.jsonl
if python - "$PORT" <<'PY'
import socket, sys
s = socket.socket(); sys.exit(0 if s.connect_ex(("127.0.0.1", int(sys.argv[1]))) == 0 else 1)
PY
then
  echo "error: port $PORT on 127.0.0.1 is in use; stop what listens there or set BUDGETGEN_DEMO_PORT (and server.base_url)" >&2
  exit 2
fi
mkdir -p logs
# --token-ids-tokenizer: a server of the demo tokenizer's model, whose usage counts that tokenizer's tokens
python scripts/mock_server.py --port "$PORT" --model mock-model --length-dist lognormal --mean-tokens 120 \
  --tokens-per-s 400 --reasoning-share 0.3 --seed 0 --token-ids-tokenizer demo/tokenizer 2> logs/demo_server.log &
server=$!
trap 'kill "$server" 2>/dev/null; wait "$server" 2>/dev/null || true' EXIT
for _ in $(seq 100); do
  python -c "import httpx,sys; httpx.get('http://127.0.0.1:$PORT/health', timeout=1)" 2>/dev/null && break
  sleep 0.1
done
snakemake --cores 2 all --config "server={base_url: 'http://127.0.0.1:$PORT/v1'}" "$@"
if [[ -f results/summary.tsv ]]; then
  echo; echo "results/summary.tsv:"; column -t -s $'\t' results/summary.tsv
  echo; ls -l results/*/tokenized.arrow
fi
