"""Stream workers: chat streams read in worker processes, so one job's ingest is not bound to one core
(server.client_processes).

The job's process keeps everything that decides or writes: the dispatch rule, the endpoint pool and its
affinity, the watchdog, retries, and the journal (its one writer). A worker only streams: it gets a
request (its URL and the body the job built), POSTs it, parses every line and chunk (budgetgen.streams,
the same code as in the job's process), and sends back, every FLUSH_S, the tokens each of its streams
received since (and when its last line came: the watchdog's), then the result or the error class it
ended in. So the budget rule sees the tokens in flight within FLUSH_S, in the chunks they came in and
at the times they came (budgetgen.progress.StreamProgress extrapolates a stream by its chunks: a
flush's sum taken for one chunk made it guess up to a flush of tokens ahead, and under the quality
gate's drops, where a stream further on is likelier dropped, dispatch too much), and a record is
still written whole by one process, or not at all.

Wire: frames of a 4-byte big-endian length and a pickle, over the worker's stdin (job -> worker:
`("init", settings)`, `("chat", rid, url, body, want_ids)`, `("cancel", rid)`) and stdout (worker -> job:
`("p", [(rid, tokens, chunks, last_token_time, last_line_time), ...])`, `("r", rid, result fields)`,
`("e", rid, kind, fields)`).
The API key never crosses the pipe: the worker reads the environment variable server.api_key_env names,
as the job does. Times are time.monotonic(), one clock for every process on the machine.

Death. A worker that exits (killed, crashed) fails its streams with a TransientError (retried like a
dropped connection: nothing was journaled) and is started again. A worker ignores SIGINT and SIGTERM
(the job, which gets them too, decides what stops) and exits when its stdin closes: when the job closes
it, or when the job dies, killed -9 included.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import os
import pickle
import signal
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING

from .engines import dialect
from .streams import (
    CONNECT_TIMEOUT_S,
    ChatResult,
    PermanentError,
    ServerRefused,
    TokenRate,
    TransientError,
    chat_http,
    stream_chat,
)

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

log = logging.getLogger(__name__)

FLUSH_S = 0.02  # how often a worker sends its streams' progress
_LEN = 4


def _frame(msg) -> bytes:
    data = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
    return len(data).to_bytes(_LEN, "big") + data


async def _read_frame(reader: asyncio.StreamReader):
    """The next message, or None at the end of the stream."""
    try:
        n = int.from_bytes(await reader.readexactly(_LEN), "big")
        return pickle.loads(await reader.readexactly(n))
    except asyncio.IncompleteReadError:
        return None


def _error_fields(exc: Exception) -> tuple[str, dict]:
    if isinstance(exc, TransientError):
        return "transient", {"message": str(exc), "retry_after": exc.retry_after, "connection": exc.connection}
    if isinstance(exc, PermanentError):
        return "permanent", {"status": exc.status, "message": exc.message}
    return "refused", {"message": str(exc)}


def _error(kind: str, fields: dict) -> Exception:
    if kind == "transient":
        return TransientError(fields["message"], retry_after=fields["retry_after"], connection=fields["connection"])
    if kind == "permanent":
        return PermanentError(fields["status"], fields["message"])
    return ServerRefused(fields["message"])


class _Worker:
    """One worker process as the job sees it: its pipe, and the streams it owns."""

    def __init__(self, proc: asyncio.subprocess.Process):
        self.proc = proc
        self.streams = {}  # rid -> (future, ep, st, on_token)
        self.reader_task = None
        self.dead = False  # its stdout ended: no new stream goes to it

    def send(self, msg) -> None:
        self.proc.stdin.write(_frame(msg))


class StreamWorkers:
    """N worker processes streaming the job's chats (ChatClient(workers=...) calls chat())."""

    def __init__(self, processes: int, *, api_key_env: str | None, concurrency: int, engine: str,
                 connect_timeout_s: float = CONNECT_TIMEOUT_S):
        self.n = int(processes)
        self.init = {"api_key_env": api_key_env, "concurrency": concurrency, "connect_timeout_s": connect_timeout_s,
                     "engine": engine}
        self.workers: list[_Worker] = []
        self.rids = itertools.count()
        self.closing = False
        self.restarts = 0
        self.started = None  # the start, begun by the first chat

    async def start(self) -> None:
        for _ in range(self.n):
            self.workers.append(await self._spawn())
        log.info(f"Streaming in {self.n} worker processes (server.client_processes)")

    async def _spawn(self) -> _Worker:
        env = dict(os.environ)
        scripts = str(Path(__file__).resolve().parents[1])
        env["PYTHONPATH"] = scripts + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "budgetgen.stream_workers",
                                                    stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                                                    env=env)
        w = _Worker(proc)
        w.send(("init", self.init))
        w.reader_task = asyncio.create_task(self._read(w))
        return w

    async def chat(self, url: str, body: dict, want_ids: bool, ep: Any, st: Any,
                   on_token: Callable[[int], object] | None) -> ChatResult:
        """Stream one chat in the worker with the fewest streams (the workers start with the first);
        see budgetgen.streams.stream_chat."""
        if self.started is None:
            self.started = asyncio.ensure_future(self.start())
        await asyncio.shield(self.started)
        live = [x for x in self.workers if not x.dead]
        if not live:
            raise TransientError("every stream worker is restarting")
        w = min(live, key=lambda x: len(x.streams))
        rid = next(self.rids)
        future = asyncio.get_running_loop().create_future()
        w.streams[rid] = (future, ep, st, on_token)
        try:
            w.send(("chat", rid, url, body, want_ids))
            return await future
        except asyncio.CancelledError:
            if w.streams.pop(rid, None) is not None and w.proc.returncode is None:
                w.send(("cancel", rid))
            raise
        finally:
            w.streams.pop(rid, None)

    async def _read(self, w: _Worker) -> None:
        while True:
            msg = await _read_frame(w.proc.stdout)
            if msg is None:
                w.dead = True
                break
            if msg[0] == "p":
                for rid, tokens, chunks, token_time, last in msg[1]:
                    entry = w.streams.get(rid)
                    if entry is None:
                        continue
                    _, ep, st, on_token = entry
                    st.last = ep.last_byte = last
                    st.got_first = True
                    if tokens and on_token is not None:
                        on_token(tokens, chunks, token_time)
            else:
                entry = w.streams.pop(msg[1], None)
                if entry is None or entry[0].done():
                    continue
                if msg[0] == "r":
                    entry[0].set_result(ChatResult(**msg[2]))
                else:
                    entry[0].set_exception(_error(msg[2], msg[3]))
        rc = await w.proc.wait()
        for future, *_ in w.streams.values():
            if not future.done():
                future.set_exception(TransientError(f"stream worker {w.proc.pid} exited ({rc})"))
        w.streams.clear()
        if not self.closing and w in self.workers:
            self.restarts += 1
            log.info(f"stream worker {w.proc.pid} exited ({rc}); its streams are retried, a new worker started")
            self.workers[self.workers.index(w)] = await self._spawn()

    async def close(self) -> None:
        """Close every worker's stdin (it exits) and wait for it; kill one that has not exited in 10 s."""
        self.closing = True
        if self.started is not None:
            await asyncio.gather(self.started, return_exceptions=True)
        for w in self.workers:
            if w.proc.returncode is None:
                w.proc.stdin.close()
        for w in self.workers:
            try:
                await asyncio.wait_for(w.proc.wait(), 10)
            except TimeoutError:
                w.proc.kill()
                await w.proc.wait()
            if w.reader_task is not None:
                await asyncio.gather(w.reader_task, return_exceptions=True)


class _WorkerSide:
    """The worker's side (see the module docstring): its streams, their progress, the pipe."""

    def __init__(self, writer: asyncio.StreamWriter, settings: dict):
        api_key = os.environ.get(settings["api_key_env"]) if settings["api_key_env"] else None
        self.writer = writer
        self.http = chat_http(api_key, settings["concurrency"], settings["connect_timeout_s"])
        self.engine, self.token_rate = dialect(settings["engine"]), TokenRate()
        self.tasks, self.live, self.sent = {}, {}, {}  # rid -> task; -> [tokens unsent], st; -> last line sent

    def flush(self, rids=None) -> None:
        """Send the tokens and last line times of the streams (all, or `rids`) that moved since."""
        batch = []
        for rid in self.live if rids is None else rids:
            pending, st = self.live[rid]
            # a stream reports once its first line came (its time: the watchdog's first byte), then as it moves
            if st.got_first and (pending[0] or st.last != self.sent.get(rid)):
                batch.append((rid, pending[0], pending[1], pending[2], st.last))
                pending[0] = pending[1] = 0
                self.sent[rid] = st.last
        if batch:
            self.writer.write(_frame(("p", batch)))

    async def run(self, rid: int, url: str, body: dict, want_ids: bool) -> None:
        pending, st = [0, 0, 0.0], SimpleNamespace(last=0.0, got_first=False)  # tokens, chunks, last one's time
        self.live[rid] = (pending, st)

        def on_token(n):  # a chunk's tokens, fed as its line came (st.last: that line's arrival)
            pending[0] += n
            pending[1] += 1
            pending[2] = st.last

        try:
            res = await stream_chat(self.http, self.engine, self.token_rate, url, body,
                                    SimpleNamespace(last_byte=0.0), st, on_token, want_ids)
            self.flush([rid])
            self.writer.write(_frame(("r", rid, dataclasses.asdict(res))))
        except (TransientError, PermanentError, ServerRefused) as exc:
            self.flush([rid])
            self.writer.write(_frame(("e", rid, *_error_fields(exc))))
        finally:
            self.live.pop(rid, None)
            self.sent.pop(rid, None)
            self.tasks.pop(rid, None)

    async def clock(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_S)
            self.flush()
            await self.writer.drain()

    async def serve(self, reader: asyncio.StreamReader) -> None:
        ticker = asyncio.create_task(self.clock())
        try:
            while (msg := await _read_frame(reader)) is not None:
                if msg[0] == "chat":
                    self.tasks[msg[1]] = asyncio.create_task(self.run(*msg[1:]))
                elif msg[0] == "cancel" and msg[1] in self.tasks:
                    self.tasks[msg[1]].cancel()
        finally:
            ticker.cancel()
            for task in list(self.tasks.values()):
                task.cancel()
            await asyncio.gather(ticker, *self.tasks.values(), return_exceptions=True)
            await self.http.aclose()


async def _serve() -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin.buffer)
    transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin, sys.stdout.buffer)
    init = await _read_frame(reader)
    if init is not None:
        await _WorkerSide(asyncio.StreamWriter(transport, protocol, None, loop), init[1]).serve(reader)


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    handler = logging.StreamHandler(sys.stderr)  # its stdout is the pipe to the job
    handler.setFormatter(logging.Formatter(f"%(asctime)s stream worker {os.getpid()}: %(message)s",
                                           "%Y-%m-%d %H:%M:%S"))
    logger = logging.getLogger("budgetgen")
    logger.handlers[:] = [handler]
    logger.setLevel(logging.INFO)
    logger.propagate = False
    t0 = time.monotonic()
    try:
        asyncio.run(_serve())
    except BrokenPipeError:  # the job is gone
        pass
    log.debug(f"done after {time.monotonic() - t0:.1f} s")


if __name__ == "__main__":
    main()
