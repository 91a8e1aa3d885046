"""Fixtures every test group shares. Helpers are in tests/support (imported as `support`); pytest's
`pythonpath` (pyproject.toml) puts scripts/ and tests/ on sys.path."""

import os

import pytest

from support import CORPUS

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_UPDATE_CHECK", "1")


@pytest.fixture(scope="session")
def tiny_tokenizer(tmp_path_factory):
    """A tiny local ChatML tokenizer folder (budgetgen_testkit.tiny_tokenizer), trained once a session."""
    from budgetgen_testkit.tiny_tokenizer import build_tokenizer

    out = tmp_path_factory.mktemp("tokenizer") / "chatml"
    build_tokenizer(out, [CORPUS], vocab_size=512)
    return out


@pytest.fixture
def server(tmp_path):
    """Factory: server(*args) starts a mock server subprocess (budgetgen_testkit.mock_server) on
    127.0.0.1 and returns its Popen with .base_url; all are stopped at teardown."""
    from budgetgen_testkit import mock_server

    procs = []

    def start(*args, env=None):
        d = tmp_path / f"server{len(procs)}"
        d.mkdir()
        proc, base_url = mock_server.spawn([str(a) for a in args], d, env=env)
        procs.append(proc)
        proc.base_url = base_url
        return proc

    yield start
    for proc in procs:
        mock_server.stop(proc)
