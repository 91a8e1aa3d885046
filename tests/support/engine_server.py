"""A real inference engine's HTTP server on 127.0.0.1 for the engine tests (transformers serve, vLLM's CPU
build): started as a subprocess, waited for until its health endpoint answers 200 (failing with the tail
of its log if it exits or does not come up), stopped at the end (terminate, then kill)."""

import contextlib
import os
import socket
import subprocess
import sys
import time

import httpx

from support import REPO


def scripted_model(root):
    """(model_dir, env): the tiny scripted Qwen3 (tests/engine/make_tiny_model.py) built under root, and the
    offline environment an engine serving it runs in."""
    model_dir = root / "scripted-qwen3"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_UPDATE_CHECK": "1", "OMP_NUM_THREADS": "1"}
    subprocess.run([sys.executable, str(REPO / "tests" / "engine" / "make_tiny_model.py"), str(model_dir)],
                   check=True, env=env, capture_output=True)
    return model_dir, env


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serving(cmd, port, log_path, env, name, health="/health", timeout_s=180):
    """Run `cmd` (a server listening on 127.0.0.1:`port`), its output in `log_path`; yield once
    GET `health` answers 200."""
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([str(c) for c in cmd], env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited {proc.returncode}: {log_path.read_text()[-3000:]}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}{health}", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name} not healthy in {timeout_s} s: {log_path.read_text()[-3000:]}")
            time.sleep(0.2)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
