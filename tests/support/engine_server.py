"""A real inference engine's HTTP server on 127.0.0.1 for the engine tests (transformers serve, vLLM's CPU
build): started as a subprocess, waited for until its health endpoint answers 200 (failing with the tail
of its log if it exits or does not come up), stopped at the end (terminate, then kill)."""

import contextlib
import socket
import subprocess
import time

import httpx


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
