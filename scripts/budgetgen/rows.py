"""Training rows for draft models: the prompt exactly as the server fed it to the model, then
exactly the tokens it generated.

A row is `prompt ids + completion ids`, loss_mask 0 on the prompt and 1 on the completion. The
generated turn is never passed through the chat template: templates are written for prompting (they
strip reasoning, prefill `<think>`, rewrite history) and do not reproduce what the model generated.

Server ids: a record with `completion_token_ids` (server.return_token_ids) uses them verbatim, after
its `prompt_token_ids` when the server returned those too (vLLM, SGLang), else after the rendered
prompt below. Nothing is appended: a response cut at max_tokens ends where the model stopped.

Text fallback, when the server returned text only:
  prompt     = apply_chat_template(messages[:-1], add_generation_prompt=True, **kwargs), with the
               chat_template_kwargs the request used (the record's params.extra_body), tokenized
               without added special tokens (what the engines do for chat prompts);
  completion = the model's raw output rebuilt from the record (TurnFormat.completion_text):
               - the generation prompt ends with the opening tag (prefilled): reasoning (even empty or
                 whitespace) + closing tag + content, as the model must close the block before any
                 content (no reasoning and the closing tag in the content: a server without a
                 reasoning parser, the content is the raw output);
               - it ends with a closed think block (thinking switched off): the model writes no think
                 block, content; reasoning that is only whitespace is a server's artifact
                 (transformers serve streams the "\n\n") and is ignored, other reasoning is rebuilt
                 as below;
               - else, when the record has reasoning (whitespace only counts: Qwen3's empty
                 `<think>\n\n</think>` under /no_think): opening tag + reasoning + closing tag +
                 content;
               - else content;
               no closing tag when the response was cut inside the reasoning (finish_reason "length",
               no content); then the end-of-turn token the template puts after an assistant turn,
               unless finish_reason is "length".
The turn's format (end-of-turn token, reasoning delimiters, whether the generation prompt opens or
closes the reasoning) is derived from the tokenizer and its template (TurnFormat), never from a list of
known models; delimiters that neither names default to the plain text `<think>` / `</think>` (what
the engines' reasoning parsers split MiniMax-M1's output on). A record whose raw output cannot be
rebuilt faithfully (reasoning, but a tokenizer that cannot write those tags: set
tokenizer.reasoning_tags) is skipped with a counted reason, as are template errors.

Each row also carries its `conversation_id` and `turn` (budgetgen.conversations: with turns: all one
row per generated turn, its prompt the history the server saw, its completion that turn alone).

The output is an Arrow IPC stream (what `datasets.Dataset.from_file` reads), written atomically;
more than max_skipped_pct percent of records skipped fails the job, naming the reason and first id.
"""

from __future__ import annotations

import json
import operator
from typing import TYPE_CHECKING

from budgetgen.chat_render import ChatRenderer
from budgetgen.turn_format import TurnFormat, check_options, record_kwargs

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence
    from typing import Any

    from transformers import PreTrainedTokenizerBase

# Skip reasons (counted, never written).
NO_SUPERVISED_TOKENS = "no_supervised_tokens"
TEMPLATE_ERROR = "template_error"
SERVER_IDS_OUT_OF_VOCAB = "server_token_ids_out_of_vocab"
REASONING_DELIMITERS_UNKNOWN = "reasoning_delimiters_unknown"

# What to do about a skip reason, said wherever skips are reported.
SKIP_HINTS = {
    REASONING_DELIMITERS_UNKNOWN: "reasoning, but no delimiters to rebuild the raw output with (the tokenizer "
                                  "cannot write <think> as text): set the ones the model writes, e.g. "
                                  "tokenizer.reasoning_tags: [\"<think>\", \"</think>\"]",
}



class RowEncoder:
    """A tokenizer plus what encoding needs, built once (per worker process)."""

    def __init__(self, tokenizer, max_length, chat_template_kwargs=None, use_server_ids=True, reasoning_tags=None,
                 split=None):
        # (max_length and chat_template_kwargs were checked by whoever built it: TokenizeOptions, encode_batch)
        self.tokenizer = tokenizer
        self.split = split  # the split whose records become rows (None: every record; budgetgen.mixture)
        self.reasoning_tags = tuple(reasoning_tags) if reasoning_tags else None
        self.use_server_ids = use_server_ids
        self.vocab_size = len(tokenizer)
        self.max_length = operator.index(max_length)
        self.kwargs = dict(chat_template_kwargs or {})
        self.formats = {}  # kwargs json -> TurnFormat (the eot may depend on the template's switches)
        self.rerender_checked, self.rerender_differs = 0, 0  # see encode()
        self.backend = getattr(tokenizer, "backend_tokenizer", None) if getattr(tokenizer, "is_fast", False) else None
        if self.backend is not None:
            # One call through the tokenizer sets the backend up as __call__ would (no truncation, no
            # padding, special-token splitting as configured); the backend is then called directly,
            # which skips building BatchEncoding/offsets. A per-batch spot check guards the shortcut.
            tokenizer(["x"], add_special_tokens=False)
        self.fast_ok = self.backend is not None and hasattr(self.backend, "encode_batch_fast")
        self.renderer = ChatRenderer(tokenizer, self.kwargs)

    def turn_format(self, kwargs: dict[str, Any]) -> TurnFormat:
        key = json.dumps(kwargs, sort_keys=True)
        if key not in self.formats:
            def render(conv):
                out, _ = self.renderer.render([conv], False, kwargs)
                return out[0]
            self.formats[key] = TurnFormat(self.tokenizer, render, self.reasoning_tags)
        return self.formats[key]

    def ids(self, texts: list[str]) -> list[list[int]]:
        if not texts:
            return []
        if self.fast_ok:
            out = [enc.ids for enc in self.backend.encode_batch_fast(texts, add_special_tokens=False)]
            if out[0] == self.tokenizer([texts[0]], add_special_tokens=False)["input_ids"][0]:
                return out
            self.fast_ok = False
        return self.tokenizer(texts, add_special_tokens=False)["input_ids"]

    def _server_ids(self, records):
        """The server's ids where the records have them: (results with the skips so far, prompt ids,
        completion ids, the indices whose prompt is rendered here, those whose server prompt ids the
        template's render is only compared with)."""
        n = len(records)
        results, prompt_ids, completion_ids, need_prompt, compared = [None] * n, [None] * n, [None] * n, [], []
        for i, rec in enumerate(records):
            server = rec.get("completion_token_ids") if self.use_server_ids else None
            if server:
                if max(server) >= self.vocab_size or min(server) < 0:
                    results[i] = SERVER_IDS_OUT_OF_VOCAB
                    continue
                completion_ids[i] = list(server)
                if rec.get("prompt_token_ids"):
                    prompt_ids[i] = list(rec["prompt_token_ids"])
                    compared.append(i)
                    continue
            need_prompt.append(i)
        return results, prompt_ids, completion_ids, need_prompt, compared

    def _compare(self, rendered: dict[int, str], prompt_ids: list) -> None:
        """The prompts rendered here of the records with the server's prompt ids, held against those ids."""
        self.rerender_checked = len(rendered)
        self.rerender_differs = sum(ids != prompt_ids[i] for i, ids in
                                    zip(rendered, self.ids(list(rendered.values()))))

    def encode(self, records: Sequence[dict[str, Any]]) -> tuple[list[tuple[list[int], int, int] | str], str | None]:
        """Per record: (ids truncated to max_length, prompt_len, end) or a skip reason.

        The loss mask is 1 on ids[prompt_len:end] and 0 elsewhere. A record is a journal record
        (dict with "messages", "finish_reason", "params"?, "prompt_token_ids"?, "completion_token_ids"?).
        A record with the server's prompt ids has its prompt rendered here too, only to compare:
        `rerender_checked` / `rerender_differs` say, for the last call, how many were and how many of them
        the chat template renders otherwise (what a trainer that re-renders the rows would get wrong).
        """
        n = len(records)
        results, prompt_ids, completion_ids, need_prompt, compared = self._server_ids(records)
        first_error = None
        # render the prompts, one group per chat_template_kwargs (each record's own)
        groups = {}
        for i in need_prompt + compared:
            kwargs = record_kwargs(records[i], self.kwargs)
            groups.setdefault(json.dumps(kwargs, sort_keys=True), (kwargs, []))[1].append(i)
        texts_of = {}  # index -> completion text to tokenize
        prompt_text, compare_text, compared = {}, {}, set(compared)
        for kwargs, idx in groups.values():
            fmt = self.turn_format(kwargs)
            rendered, err = self.renderer.render([records[i]["messages"][:-1] for i in idx], True, kwargs)
            first_error = first_error or err
            for i, text in zip(idx, rendered):
                if text is None:
                    results[i] = TEMPLATE_ERROR
                    continue
                if i in compared:  # the server's own prompt ids: the render only compared with them
                    compare_text[i] = text
                    continue
                prompt_text[i] = text
                if completion_ids[i] is None:
                    rec = records[i]
                    raw = fmt.completion_text(rec["messages"][-1], text, rec.get("finish_reason"))
                    if raw is None:
                        results[i] = REASONING_DELIMITERS_UNKNOWN
                        continue
                    texts_of[i] = (raw, None if rec.get("finish_reason") == "length" else fmt.eot)
        order = [i for i in prompt_text if results[i] is None]
        for i, ids in zip(order, self.ids([prompt_text[i] for i in order])):
            prompt_ids[i] = ids
        self._compare(compare_text, prompt_ids)
        order = [i for i in texts_of if results[i] is None]
        for i, ids in zip(order, self.ids([texts_of[i][0] for i in order])):
            eot = texts_of[i][1]
            completion_ids[i] = ids + [eot] if eot is not None else ids
        for i in range(n):
            if results[i] is None:
                results[i] = self._row(prompt_ids[i], completion_ids[i])
        return results, first_error

    def _row(self, p: list[int], c: list[int]) -> tuple[list[int], int, int] | str:
        """(prompt + completion ids cut at max_length, prompt length, end), or NO_SUPERVISED_TOKENS."""
        ids = p + c
        end = min(len(ids), self.max_length)
        ids = ids[:end]
        return NO_SUPERVISED_TOKENS if end <= len(p) else (ids, len(p), end)


def encode_batch(tokenizer: PreTrainedTokenizerBase, records: Iterable[dict[str, Any] | Iterable[dict[str, Any]]],
                 max_length: int, chat_template_kwargs: dict[str, Any] | None = None, use_server_ids: bool = True,
                 reasoning_tags: Iterable[str] | None = None) -> list[tuple[list[int], list[int]] | str]:
    """Encode journal records (or plain conversations: lists of messages whose last one is the
    generated assistant turn, taken as finished with "stop").

    Returns, per record, (input_ids, loss_mask) as lists of ints, or a skip-reason string
    ("no_supervised_tokens", "template_error", "server_token_ids_out_of_vocab",
    "reasoning_delimiters_unknown").
    """
    check_options(max_length, chat_template_kwargs)
    encoder = RowEncoder(tokenizer, max_length, chat_template_kwargs, use_server_ids, reasoning_tags)
    records = [r if isinstance(r, dict) else {"messages": list(r), "finish_reason": "stop"} for r in records]
    results, _ = encoder.encode(records)
    out = []
    for res in results:
        if isinstance(res, str):
            out.append(res)
        else:
            ids, lp, end = res
            out.append((list(ids), [0] * lp + [1] * (end - lp) + [0] * (len(ids) - end)))
    return out
