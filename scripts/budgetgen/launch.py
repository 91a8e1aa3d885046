"""A server started by the inference job itself (`server.launch`): start, wait until ready, stop.

The command template is split like a shell would split it (shlex) and run without a shell; the
placeholders {port} {host} {model} {model_path} {dataset} are substituted inside each word, so no
config value can become shell syntax, and other braces (JSON arguments) are left alone. The server
runs in its own session (its process group is what `stop` signals, so its workers go too) and gets
SIGTERM if the job dies without stopping it (Linux parent-death signal). Its output goes to a log file.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import re
import shlex
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING

from .endpoints import ServerUnreachable
from .errors import UserError

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from .client import ChatClient

log = logging.getLogger(__name__)

PLACEHOLDER = re.compile(r"\{(port|host|model|model_path|dataset)\}")
PR_SET_PDEATHSIG = 1


def render_command(template: str, values: Mapping[str, object]) -> list[str]:
    """argv of the launch template with the placeholders filled in; a value never changes word boundaries."""
    try:
        words = shlex.split(template)
    except ValueError as exc:
        raise UserError(f"server.launch is not a valid command line ({exc}): {template!r}") from None
    if not words:
        raise UserError("server.launch is empty")
    return [PLACEHOLDER.sub(lambda m: str(values[m.group(1)]), w) for w in words]


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _die_with_parent():
    # runs in the child between fork and exec: ask the kernel for SIGTERM when the job process dies
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


class LaunchedServer:
    def __init__(self, template, log_path, *, model, model_path=None, dataset="", port=0, host="127.0.0.1",
                 ready_timeout_s=1800.0, stop_timeout_s=30.0):
        self.port = port or free_port(host)
        self.values = {"port": self.port, "host": host, "model": model, "model_path": model_path or model,
                       "dataset": dataset}
        self.argv = render_command(template, self.values)
        self.base_url = f"http://{host}:{self.port}/v1"
        self.log_path = Path(log_path)
        self.ready_timeout_s = ready_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.proc = None

    def start(self) -> LaunchedServer:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as out:
            out.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} starting: {shlex.join(self.argv)}\n".encode())
            out.flush()
            try:
                self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                             start_new_session=True, preexec_fn=_die_with_parent)
            except OSError as exc:
                raise UserError(f"server.launch could not start {self.argv[0]!r}: {exc.strerror}") from None
        log.info(f"Launched server pid {self.proc.pid} on {self.base_url} (log: {self.log_path}): "
                 f"{shlex.join(self.argv)}")
        return self

    def last_log_line(self) -> str:
        try:
            lines = [x for x in self.log_path.read_text(errors="replace").splitlines() if x.strip()]
        except OSError:
            return ""
        return lines[-1][:300] if lines else ""

    async def wait_ready(self, client: ChatClient, stopping: Callable[[], bool] = lambda: False) -> None:
        """Poll the server's /models until it serves the model; fail fast if it exits; deadline."""
        t0 = time.monotonic()
        while True:
            if self.proc.poll() is not None:
                raise UserError(f"server.launch exited with code {self.proc.returncode} before it was ready; "
                                f"see {self.log_path} (last line: {self.last_log_line()!r})")
            try:
                await client.check_server()
                log.info(f"Server ready after {time.monotonic() - t0:.1f} s")
                return
            except ServerUnreachable:
                pass
            if stopping():
                return
            if time.monotonic() - t0 > self.ready_timeout_s:
                raise UserError(f"server.launch not ready at {self.base_url} after {self.ready_timeout_s:g} s "
                                f"(server.launch_ready_timeout_s); see {self.log_path}")
            await asyncio.sleep(1.0 if time.monotonic() - t0 > 5 else 0.2)

    def stop(self) -> None:
        """SIGTERM the server's process group, SIGKILL after stop_timeout_s; idempotent."""
        if self.proc is None or self.proc.returncode is not None:
            return
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                log.info(f"server pid {self.proc.pid} still running {self.stop_timeout_s:g} s after SIGTERM: SIGKILL")
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            except ProcessLookupError:
                self.proc.wait()
        # its workers (same process group) must not outlive it either
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        log.info(f"Stopped server pid {self.proc.pid} (exit code {self.proc.returncode})")
