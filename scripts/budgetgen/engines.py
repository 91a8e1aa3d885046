"""Engines as dialects: what each inference server's released OpenAI-compatible chat stream looks like.

The client (budgetgen.client) speaks OpenAI chat-completions streaming to every server and asks its
dialect for what differs: the request fields that ask for token ids, where the ids come back, which
delta fields carry reasoning, whether per-chunk usage is sent, how an error object reads, and the
hint a user gets when the ids do not come. No other module knows an engine's field names
(tests/unit/test_conventions.py checks it).

Each dialect names the release whose server source it was read from (`pip download --no-deps`, unzip,
read; the README's engine table says what was read where):

  openai    any OpenAI-compatible server (transformers serve, proxies): reasoning in
            `reasoning_content` or `reasoning`; no token ids
  vllm      vLLM 0.33.0: `return_token_ids: true` puts `prompt_token_ids` on the first chunk and
            `token_ids` on every choice chunk; reasoning in `delta.reasoning`
  sglang    SGLang 0.5.23: `return_input_ids_in_sglext` / `return_output_ids_in_sglext` send one
            chunk `{"choices": [], "sglext": {"input_ids": [...], "output_ids": [[...]]}}` before the
            usage chunk; reasoning in `delta.reasoning_content`; unknown request fields are dropped
  llamacpp  llama.cpp's `llama-server` (tools/server, llama.cpp 0c1e570 as vendored in PyPI
            llama-cpp-python 0.3.36): usage only on the final `choices: []` chunk (no continuous usage);
            no token ids in chat streams (`return_tokens` is for /completion only); SSE comment pings
            while silent. Every request asks `reasoning_format: "none"` (server-common.cpp reads it per
            request): its reasoning parsers (`auto`, `deepseek`) drop the whitespace after `</think>`
            from the text they return, so a row rebuilt from reasoning_content + content is a token short
            of what the model generated (issue 42: 0 of 15 rows exact; -7 % of the supervised tokens over
            a larger run); with `none` the raw text, `<think>...</think>` and all, is the content (15 of
            15 exact). A user's extra_body may still set another.

`server.engine` picks one (default `auto`: the engine `server.return_token_ids` names, else openai).
Adding an engine: README, "Adding an engine".
"""

from __future__ import annotations

import json
from dataclasses import dataclass

ENGINES = ("openai", "vllm", "sglang", "llamacpp")


@dataclass(frozen=True)
class Dialect:
    """One engine's chat-stream wire format (the module docstring)."""

    name: str
    imitates: str  # the release whose server was read
    reasoning_fields: tuple = ("reasoning_content", "reasoning")
    ids_fields: tuple = ()  # request fields that ask for the prompt's and the generated ids while streaming
    ids_hint: str = ""  # what to do when the ids do not come
    continuous_usage: bool = True  # honours stream_options.continuous_usage_stats
    ids_in_choices: bool = False  # choice_ids() may find ids in a chunk's choices (else it is never asked)
    thinking_budget_how: str = ""  # how the engine caps reasoning per request ("": it cannot)
    fixed_fields: tuple = ()  # (name, value) every request carries (before extra_body, which may override)

    @property
    def sends_ids(self) -> bool:
        return bool(self.ids_fields)

    def request_fields(self, want_ids: bool) -> dict:
        """Fields added to a chat request's body."""
        return {name: True for name in self.ids_fields} if want_ids else {}

    def thinking_fields(self, budget: int, processor: str | None = None) -> dict:
        """The request fields that cap a request's reasoning at `budget` tokens (`processor`: SGLang's
        model-specific processor, server.thinking_processor)."""
        raise ValueError(f"{self.imitates} has no per-request thinking budget")

    def stream_options(self, continuous_usage_stats: bool) -> dict:
        options = {"include_usage": True}
        if continuous_usage_stats and self.continuous_usage:
            options["continuous_usage_stats"] = True
        return options

    def reasoning(self, delta: dict) -> str | None:
        """The reasoning text of one delta, or None."""
        for name in self.reasoning_fields:
            if delta.get(name):
                return delta[name]
        return None

    def chunk_ids(self, chunk: dict) -> tuple[list[int] | None, list[int] | None]:
        """(prompt ids, generated ids) a chunk carries at its top level (None where it carries none);
        generated ids here are the whole response's."""
        return None, None

    def choice_ids(self, choice: dict) -> tuple[list[int] | None, list[int] | None]:
        """(prompt ids, generated ids of this chunk) a choice carries (None where it carries none)."""
        return None, None

    def refused_field(self, message: str) -> str | None:
        """The ids field an error message names (a server refusing it), or None."""
        return next((f for f in self.ids_fields if f in message), None)

    @staticmethod
    def error_status(obj: object) -> int | None:
        """The HTTP-like status of an error object (`{"error": {"code": 400, ...}}`, SGLang's
        `{"object": "error", "code": 400}`), or None."""
        err = obj.get("error") if isinstance(obj, dict) else None
        if not isinstance(err, dict):
            err = obj if isinstance(obj, dict) else {}
        for key in ("code", "status", "status_code"):
            value = err.get(key)
            if isinstance(value, int) and 100 <= value <= 599:
                return value
            if isinstance(value, str) and value.isdigit() and 100 <= int(value) <= 599:
                return int(value)
        return None

    @staticmethod
    def error_message(body: str | bytes) -> str:
        """An error body's message, at most 300 characters."""
        try:
            obj = json.loads(body)
            err = obj.get("error", obj)
            if isinstance(err, dict):
                return str(err.get("message") or err.get("detail") or obj)[:300]
            return str(err)[:300]
        except (ValueError, AttributeError):
            return body[:300].decode(errors="replace") if isinstance(body, bytes) else str(body)[:300]

    @staticmethod
    def is_error_chunk(chunk: dict) -> bool:
        return "error" in chunk and not chunk.get("choices")


class VLLM(Dialect):
    def thinking_fields(self, budget: int, processor: str | None = None) -> dict:
        # vllm/entrypoints/openai/chat_completion/protocol.py: ChatCompletionRequest.thinking_token_budget; the
        # sampler forces the reasoning parser's end string (</think>) once the reasoning reaches it
        return {"thinking_token_budget": int(budget)}

    def chunk_ids(self, chunk: dict) -> tuple[list[int] | None, list[int] | None]:
        return chunk.get("prompt_token_ids") or None, None

    def choice_ids(self, choice: dict) -> tuple[list[int] | None, list[int] | None]:
        return choice.get("prompt_token_ids") or None, choice.get("token_ids") or None


# SGLang 0.5.23 sglang/srt/sampling/custom_logit_processor.py: the thinking-budget processors per model family
SGLANG_PROCESSORS = {"qwen3": "Qwen3ThinkingBudgetLogitProcessor",
                     "deepseek_r1": "DeepSeekR1ThinkingBudgetLogitProcessor",
                     "glm4_moe": "Glm4MoeThinkingBudgetLogitProcessor",
                     "inkling": "InklingThinkingBudgetLogitProcessor"}
SGLANG_PROCESSOR_MODULE = "sglang.srt.sampling.custom_logit_processor"


def class_reference_pickle(module: str, name: str) -> bytes:
    """A pickle (protocol 4) of a reference to the class `module.name`: what dill.dumps(cls) makes of an
    importable class, and what SGLang's CustomLogitProcessor.from_str loads (dill.loads) on the server."""
    body = (b"\x8c" + bytes([len(module)]) + module.encode() + b"\x94"
            + b"\x8c" + bytes([len(name)]) + name.encode() + b"\x94\x93\x94.")
    return b"\x80\x04\x95" + len(body).to_bytes(8, "little") + body


class SGLang(Dialect):
    def thinking_fields(self, budget: int, processor: str | None = None) -> dict:
        # CustomLogitProcessor.to_str(): {"callable": dill.dumps(cls).hex()}; the budget in custom_params
        # (ThinkingBudgetLogitProcessor reads custom_params["thinking_budget"]); the server needs
        # --enable-custom-logit-processor (else HTTP 400)
        ref = class_reference_pickle(SGLANG_PROCESSOR_MODULE, SGLANG_PROCESSORS[processor or "qwen3"])
        return {"custom_logit_processor": json.dumps({"callable": ref.hex()}),
                "custom_params": {"thinking_budget": int(budget)}}

    def chunk_ids(self, chunk: dict) -> tuple[list[int] | None, list[int] | None]:
        ext = chunk.get("sglext")
        if not isinstance(ext, dict):
            return None, None
        out = ext.get("output_ids")
        return ext.get("input_ids") or None, (out[0] if out and isinstance(out[0], list) else None)


DIALECTS = {
    "openai": Dialect("openai", "any OpenAI-compatible server"),
    "vllm": VLLM(
        "vllm", "vLLM 0.33.0", reasoning_fields=("reasoning", "reasoning_content"),
        ids_fields=("return_token_ids",), ids_in_choices=True,
        thinking_budget_how="thinking_token_budget (the server needs --reasoning-parser or --reasoning-config)",
        ids_hint="vLLM sends them with return_token_ids unless extra_body.include_reasoning is false (remove it); "
                 "for SGLang set server.return_token_ids: sglang"),
    "sglang": SGLang(
        "sglang", "SGLang 0.5.23", reasoning_fields=("reasoning_content",),
        ids_fields=("return_input_ids_in_sglext", "return_output_ids_in_sglext"),
        thinking_budget_how="its thinking-budget logit processor (custom_logit_processor + custom_params; the "
                            "server needs --enable-custom-logit-processor)",
        ids_hint="SGLang (0.5.23) sends them with return_input_ids_in_sglext/return_output_ids_in_sglext, "
                 "or launch it with --return-input-ids --return-output-ids; for vLLM set "
                 "server.return_token_ids: vllm"),
    "llamacpp": Dialect("llamacpp", "llama.cpp llama-server 0c1e570 (llama-cpp-python 0.3.36)",
                        reasoning_fields=("reasoning_content",), continuous_usage=False,
                        fixed_fields=(("reasoning_format", "none"),)),
}

# request fields a user must not set in extra_body: the setting that sends them (the schema's one-line errors)
IDS_REQUEST_FIELDS = {f: name for name, d in DIALECTS.items() for f in d.ids_fields}


def dialect(name: str) -> Dialect:
    return DIALECTS[name]


def resolve(server: dict) -> tuple[str, bool]:
    """(engine name, ids wanted) from the validated `server` section: `server.engine` (auto: the engine
    `return_token_ids` names, true meaning vLLM's; else openai) and whether ids are asked for."""
    ids = server.get("return_token_ids") or False
    named = "vllm" if ids is True else (ids or None)
    engine = server.get("engine") or "auto"
    if engine == "auto":
        engine = named or "openai"
    return engine, bool(ids)


def thinking_problem(server: dict, key: str) -> str | None:
    """One line where a thinking budget (config key `key`) is asked of an engine that cannot enforce it, or
    of SGLang without server.thinking_processor; else None."""
    engine, _ = resolve(server)
    chosen = DIALECTS[engine]
    if not chosen.thinking_budget_how:
        can = ", ".join(f"{n} ({d.thinking_budget_how})" for n, d in DIALECTS.items() if d.thinking_budget_how)
        return (f"config key {key}: {chosen.imitates} (server.engine: {engine}) cannot cap reasoning per request; "
                f"engines that can: {can}; set server.engine or remove {key}")
    if engine == "sglang" and not server.get("thinking_processor"):
        return (f"config key {key}: SGLang's thinking budget is a model-specific logit processor; set "
                f"server.thinking_processor to one of {', '.join(SGLANG_PROCESSORS)} (the target's family)")
    return None


def engine_problem(server: dict) -> str | None:
    """One line where `server.engine` and `server.return_token_ids` disagree, or the engine sends no ids;
    else None."""
    ids = server.get("return_token_ids") or False
    engine, want = resolve(server)
    if not want:
        return None
    chosen = DIALECTS[engine]
    if not chosen.sends_ids:
        senders = ", ".join(n for n, d in DIALECTS.items() if d.sends_ids)
        return (f"config key server.return_token_ids: {ids} asks {chosen.imitates} (server.engine: {engine}) for "
                f"token ids, which it does not send in chat streams (engines that do: {senders}); set "
                "server.return_token_ids: false (rows are then the template's render of the text)")
    if ids is not True and ids != engine:
        return (f"config key server.return_token_ids: {ids} names another engine than server.engine: {engine}; "
                f"set server.return_token_ids: true (the ids of server.engine) or make them agree")
    return None
