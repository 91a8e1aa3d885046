"""The target's chat template rendered to text, as the engines render it for a chat request.

ChatRenderer: contents as OpenAI parts for templates that read them so (MiniMax-M1's
`message['content'][0]['text']`, which the engines convert to), and the compiled template called
directly, without apply_chat_template's per-call overhead, behind a spot check against
apply_chat_template on every batch (any difference turns the shortcut off).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from budgetgen.turn_format import TurnFormat, as_parts, prepare_messages

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any


class ChatRenderer:
    """One tokenizer's chat template, with the default chat_template_kwargs (`kwargs`)."""

    def __init__(self, tokenizer, kwargs):
        self.tokenizer = tokenizer
        self.kwargs = kwargs
        self.content_parts = self._wants_content_parts()
        self.direct = self._setup_direct()

    def _wants_content_parts(self):
        """Whether the template reads message content as OpenAI parts ([{"type": "text", "text"}]),
        as MiniMax-M1's does (`message['content'][0]['text']`); the engines detect this and convert
        string contents before rendering, and so does this encoder."""
        probe = TurnFormat.PROBE
        conv = [{"role": "user", "content": probe}]

        def renders(c):
            try:
                out = self.tokenizer.apply_chat_template(c, tokenize=False, add_generation_prompt=True, **self.kwargs)
            except Exception:
                return False
            return probe in out

        return not renders(conv) and renders(as_parts(conv))

    def render(self, conversations: Sequence[list[dict[str, Any]]], add_generation_prompt: bool,
               kwargs: Mapping[str, Any]) -> tuple[list[str | None], str | None]:
        """Render each conversation to text; failures become None (with the first error's text)."""
        if self.content_parts:
            conversations = [as_parts(conv) for conv in conversations]
        if self.direct is not None:
            out = self._render_direct(conversations, add_generation_prompt, kwargs)
            if out is not None:
                return out, None
        apply = self.tokenizer.apply_chat_template
        try:
            return apply(conversations, tokenize=False, add_generation_prompt=add_generation_prompt,
                         **kwargs), None
        except Exception:
            pass
        out, first_error = [], None
        for conv in conversations:
            try:
                out.append(apply([conv], tokenize=False, add_generation_prompt=add_generation_prompt,
                                 **kwargs)[0])
            except Exception as exc:
                out.append(None)
                first_error = first_error or f"{type(exc).__name__}: {exc}"
        return out, first_error

    def _setup_direct(self):
        """The compiled template, to render without apply_chat_template's per-call overhead.

        apply_chat_template deep-copies every conversation into plain data for the sandbox, drops
        None-valued keys and aliases the reasoning fields; for JSON-loaded messages only the last two
        change anything, and _prepare does them. A per-batch spot check against apply_chat_template
        turns this off if it ever renders differently.
        """
        try:
            from transformers.utils.chat_template_utils import _compile_jinja_template

            template = _compile_jinja_template(self.tokenizer.get_chat_template())
        except Exception:
            return None
        return template, dict(self.tokenizer.special_tokens_map)

    def _render_direct(self, conversations, add_generation_prompt, kwargs):
        template, variables = self.direct
        try:
            out = [template.render(messages=prepare_messages(conv), tools=None, documents=None,
                                   add_generation_prompt=add_generation_prompt, **variables, **kwargs)
                   for conv in conversations]
            check = self.tokenizer.apply_chat_template(
                [conversations[0]], tokenize=False, add_generation_prompt=add_generation_prompt, **kwargs)[0]
        except Exception:
            return None  # apply_chat_template's path sorts out which conversation fails
        if out[0] != check:
            self.direct = None
            return None
        return out
