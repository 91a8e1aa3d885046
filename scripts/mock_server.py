#!/usr/bin/env python3
"""Entry point: python scripts/mock_server.py [options]  (see budgetgen_testkit/mock_server.py, --help)."""

from budgetgen.entry import run_main
from budgetgen_testkit.mock_server import main

if __name__ == "__main__":
    run_main(main)
