#!/usr/bin/env bash
# Set up (first use) and run the test suite on every core (pytest-xdist; `-n 0` runs it in one process).
# Extra arguments go to pytest (e.g. -k journal).
set -euo pipefail
cd "$(dirname "$0")"
bash bin/setup --test
export HF_HUB_OFFLINE=1 HF_HUB_DISABLE_UPDATE_CHECK=1 TOKENIZERS_PARALLELISM=false
exec .venv/bin/python -m pytest -n auto --dist loadgroup "$@"
