"""A small real HTTP server on loopback whose chat answers are scripted per request, for the server
behaviours the mock server does not simulate (an error object inside a stream, 401 on chat only, no
usage, a queued request's silent wait, an engine's `abort`).

    def answer(body, n):           # the n-th chat request (from 1) and its JSON body
        return sse([delta("hi"), finish("stop"), usage(1)])    # or json_reply(400, {...})

    with ScriptedServer(answer) as srv:
        srv.base_url, srv.bodies

An SSE script is a list of items: a dict (sent as one `data:` event), a str (sent as a raw line),
or a float (sleep that many seconds). Each request runs in its own thread.
"""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def delta(content=None, reasoning=None, token_ids=None, usage_so_far=None):
    d = {}
    if content is not None:
        d["content"] = content
    if reasoning is not None:
        d["reasoning_content"] = reasoning
    choice = {"index": 0, "delta": d, "finish_reason": None}
    if token_ids is not None:
        choice["token_ids"] = token_ids
    ev = {"object": "chat.completion.chunk", "model": "mock-model", "choices": [choice]}
    if usage_so_far is not None:
        ev["usage"] = {"prompt_tokens": 1, "completion_tokens": usage_so_far, "total_tokens": usage_so_far + 1}
    return ev


def finish(reason="stop"):
    return {"object": "chat.completion.chunk", "model": "mock-model",
            "choices": [{"index": 0, "delta": {}, "finish_reason": reason}]}


def usage(completion_tokens):
    return {"object": "chat.completion.chunk", "model": "mock-model", "choices": [],
            "usage": {"prompt_tokens": 1, "completion_tokens": completion_tokens,
                      "total_tokens": completion_tokens + 1}}


def sse(items):
    return ("sse", list(items))


def json_reply(status, obj):
    return ("json", status, obj)


def answer_words(n_tokens, words_per_event=1, pause=0.0):
    """A whole SSE script of n_tokens one-word tokens, `words_per_event` per event, then usage."""
    items, sent = [], 0
    while sent < n_tokens:
        k = min(words_per_event, n_tokens - sent)
        items.append(delta(" w" * k))
        if pause:
            items.append(pause)
        sent += k
    return items + [finish("stop"), usage(n_tokens), "data: [DONE]"]


class ScriptedServer:
    def __init__(self, answer, models=("mock-model",)):
        self.answer = answer
        self.models = list(models)
        self.bodies = []
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def send_json(self, status, obj):
                data = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path.rstrip("/").endswith("/models"):
                    return self.send_json(200, {"object": "list", "data": [{"id": m} for m in outer.models]})
                return self.send_json(404, {"error": {"message": "not found", "code": 404}})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                with outer.lock:
                    outer.bodies.append(body)
                    n = len(outer.bodies)
                reply = outer.answer(body, n)
                if reply[0] == "json":
                    return self.send_json(reply[1], reply[2])
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                self.close_connection = True
                try:
                    for item in reply[1]:
                        if isinstance(item, (int, float)):
                            time.sleep(item)
                            continue
                        line = item if isinstance(item, str) else "data: " + json.dumps(item)
                        self.wfile.write((line + "\n\n").encode())
                        self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()
