"""prompts.jsonl parsing: four record shapes normalised to chat messages, with stable ids.

One JSON object per line. Accepted shapes (the first field found wins, in this order):

  messages       OpenAI chat: [{"role", "content"}, ...]; roles system, developer (-> system),
                 user, assistant; content is a string or a list of {"type": "text", "text"} parts
  conversations  ShareGPT: [{"from", "value"}, ...] (human/user, gpt/assistant/chatgpt/bard/model,
                 system), or [{"role", "content"}, ...] items as some exports write them
  prompt         {"prompt": str} -> one user turn
  instruction    Alpaca: {"instruction": str, "input": str?} -> one user turn, instruction + "\\n\\n" + input

`prompt` and `instruction` records may carry "system": str; a system turn is added only when the
record gives one (never injected). Turns after the last user turn are dropped: the workflow
generates the next assistant turn. Only role and content are kept from each turn.

Ids: a record's "id" (string or integer) is used as a string; otherwise the id is a hash of the
normalised messages (`stable_id`), so the same conversation gets the same id whatever the source
format or key order. A later line repeating an id with the same messages is dropped and counted as
a duplicate; repeating an id with different messages is a bad line.

Text must be valid Unicode: a string anywhere in the record (content, system, id, a key, a field
budgetgen does not read) holding a lone surrogate, which JSON can spell as an escape ("\\ud800", as
scraped dumps with split emoji have) but UTF-8 cannot encode, makes the line bad; it would
otherwise fail every request and every id hash far from its line.

Bad lines: by default (on_bad_line="error") the first malformed line stops the run with a one-line
UserError naming file:line and the reason. With on_bad_line="skip" each bad line is skipped and
recorded with its line number and reason (PromptSet.skipped), and parsing continues. Blank
(whitespace-only) lines are ignored: not counted, not an error. A file that yields no prompt at all
is an error either way.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from budgetgen.errors import UserError

if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any

ON_BAD_LINE = ("error", "skip")
PROMPT_FIELDS = ("messages", "conversations", "prompt", "instruction")

_OPENAI_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
_SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                   "chatgpt": "assistant", "bard": "assistant", "model": "assistant", "system": "system"}
_QUOTE_MAX = 60
_SURROGATE = re.compile("[\ud800-\udfff]")  # json.loads joins a valid pair; what is left is lone
# in a line that decoded as UTF-8 (which refuses encoded surrogates) only an escape can make one
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


@dataclass(frozen=True)
class Prompt:
    id: str
    messages: tuple  # tuple of {"role": str, "content": str}; treat as read-only
    line: int  # 1-based line number in the prompts file


@dataclass
class PromptSet:
    path: str
    prompts: list = field(default_factory=list)  # list[Prompt], unique by id, in file order
    duplicates: int = 0  # lines dropped: id already seen with the same messages
    skipped: list = field(default_factory=list)  # list[(line, reason)] under on_bad_line="skip"
    lines: int = 0  # non-blank lines read
    in_earlier: int = 0  # left out: their content is in an earlier dataset (generation.dedup_across_datasets)


class _Bad(Exception):
    """A problem with one record; carries the short reason only."""


def _q(value):
    """Quote a value for an error message, truncated so a huge value cannot flood the line."""
    s = value if isinstance(value, str) else str(value)
    if len(s) > _QUOTE_MAX:
        s = s[: _QUOTE_MAX - 3] + "..."
    return repr(s)


def _tname(value):
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "list"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _place(path):
    """A path of keys and indexes as the errors write it: field 'prompt', messages[0].content."""
    if len(path) == 1 and isinstance(path[0], str):
        return f"field {_q(path[0])}"
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part.isidentifier():
            out += f".{part}" if out else part
        else:
            out += f"[{_q(part)}]"
    return out


def _check_unicode(obj):
    """Raise _Bad naming the first string of a parsed record (in document order, a key before its
    value) that holds a lone surrogate."""
    stack = [(obj, ())]
    while stack:  # iterative: a record may nest as deeply as json.loads allows
        value, path = stack.pop()
        if isinstance(value, dict):
            for key in value:
                if _SURROGATE.search(key):
                    raise _Bad(_surrogate_reason(key, f"a key of {_place(path) if path else 'the record'}"))
            stack.extend((v, (*path, k)) for k, v in reversed(value.items()))
        elif isinstance(value, list):
            stack.extend((value[i], (*path, i)) for i in range(len(value) - 1, -1, -1))
        elif isinstance(value, str) and _SURROGATE.search(value):
            raise _Bad(_surrogate_reason(value, _place(path) if path else "the line"))


def _surrogate_reason(text, place):
    return f"invalid Unicode: lone surrogate \\u{ord(_SURROGATE.search(text).group()):04x} in {place}"


def _content(value, role, where):
    """A turn's content as one string: a string, or text parts joined with ""."""
    if isinstance(value, str):
        return value
    if value is None:
        if role == "assistant":
            return ""
        raise _Bad(f"missing content in {where}")
    if isinstance(value, list):
        texts = []
        for j, part in enumerate(value):
            if not isinstance(part, dict):
                raise _Bad(f"content part {where}.content[{j}] is not an object (got {_tname(part)})")
            ptype = part.get("type")
            if ptype != "text":
                raise _Bad(f"unsupported content part type {_q(ptype)} in {where}.content[{j}]")
            text = part.get("text")
            if not isinstance(text, str):
                raise _Bad(f"{where}.content[{j}].text must be a string (got {_tname(text)})")
            texts.append(text)
        return "".join(texts)
    raise _Bad(f"{where}.content must be a string or a list of text parts (got {_tname(value)})")


def _turns(items, field_name, sharegpt):
    if not isinstance(items, list):
        raise _Bad(f"field '{field_name}' must be a list (got {_tname(items)})")
    out = []
    for i, item in enumerate(items):
        where = f"{field_name}[{i}]"
        if not isinstance(item, dict):
            raise _Bad(f"{where} is not an object (got {_tname(item)})")
        if sharegpt and "from" in item:
            raw_role = item["from"]
            if not isinstance(raw_role, str):
                raise _Bad(f"{where}.from must be a string (got {_tname(raw_role)})")
            role = _SHAREGPT_ROLES.get(raw_role.lower())
            if role is None:
                raise _Bad(f"unknown role {_q(raw_role)} in {where}")
            value = item.get("value")
            if isinstance(value, list):
                raise _Bad(f"{where}.value must be a string (got list)")
            content = _content(value, role, where)
        else:
            if "role" not in item:
                key = "'from' or 'role'" if sharegpt else "'role'"
                raise _Bad(f"missing {key} in {where}")
            raw_role = item["role"]
            if not isinstance(raw_role, str):
                raise _Bad(f"{where}.role must be a string (got {_tname(raw_role)})")
            role = _OPENAI_ROLES.get(raw_role)
            if role is None:
                raise _Bad(f"unknown role {_q(raw_role)} in {where}")
            content = _content(item.get("content"), role, where)
        out.append({"role": role, "content": content})
    return out


def _optional_str(obj, key):
    value = obj.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise _Bad(f"field '{key}' must be a string (got {_tname(value)})")
    return value


def _single_turn(obj, user_text):
    messages = []
    system = _optional_str(obj, "system")
    if system is not None and system.strip():
        messages.append({"role": "system", "content": system})
    messages.append({"role": "user", "content": user_text})
    return messages


def _normalise(obj, check_unicode=True):
    if not isinstance(obj, dict):
        raise _Bad(f"line is not a JSON object (got {_tname(obj)})")
    if check_unicode:
        _check_unicode(obj)
    if "messages" in obj:
        messages = _turns(obj["messages"], "messages", sharegpt=False)
    elif "conversations" in obj:
        messages = _turns(obj["conversations"], "conversations", sharegpt=True)
    elif "prompt" in obj:
        prompt = obj["prompt"]
        if not isinstance(prompt, str):
            raise _Bad(f"field 'prompt' must be a string (got {_tname(prompt)})")
        messages = _single_turn(obj, prompt)
    elif "instruction" in obj:
        instruction = obj["instruction"]
        if not isinstance(instruction, str):
            raise _Bad(f"field 'instruction' must be a string (got {_tname(instruction)})")
        extra = _optional_str(obj, "input")
        text = instruction
        if extra is not None and extra.strip():
            text = instruction + "\n\n" + extra if instruction.strip() else extra
        messages = _single_turn(obj, text)
    else:
        raise _Bad(f"no recognised prompt field (expected one of {', '.join(PROMPT_FIELDS)})")

    last_user = None
    for i in range(len(messages) - 1, -1, -1):
        if messages[i]["role"] == "user":
            last_user = i
            break
    if last_user is None:
        raise _Bad("no user turn")
    if not messages[last_user]["content"].strip():
        raise _Bad("empty content: the last user turn is empty")
    return messages[: last_user + 1]


def normalise_record(obj: object, where: str) -> list:
    """Normalise one parsed record to [{"role", "content"}, ...] ending with a user turn.

    Raises UserError(f"{where}: {reason}") for a record that cannot be used.
    """
    try:
        return _normalise(obj)
    except _Bad as exc:
        raise UserError(f"{where}: {exc}") from None


def stable_id(messages: Iterable[dict[str, Any]]) -> str:
    """Id from the normalised messages: same conversation -> same id, whatever the source format."""
    blob = json.dumps(list(messages), ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    return "p" + hashlib.sha256(blob.encode("utf-8")).hexdigest()[:20]


def _record_id(obj, messages):
    if "id" not in obj:
        return stable_id(messages)
    value = obj["id"]
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise _Bad(f"field 'id' must be a string or an integer (got {_tname(value)})")
    value = str(value)
    if not value:
        raise _Bad("field 'id' is an empty string")
    return value


def _parse_line(raw, lineno):
    """Decode and normalise one non-blank line; returns (id, messages) or raises _Bad."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _Bad(f"not valid UTF-8 (bad byte at offset {exc.start})") from None
    if lineno == 1 and text.startswith("\ufeff"):
        text = text[1:]
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        at = "" if exc.msg.endswith(" at") else " at"  # "Unterminated string starting at"
        raise _Bad(f"malformed JSON ({exc.msg}{at} column {exc.colno})") from None
    except RecursionError:
        raise _Bad("malformed JSON (nested too deeply)") from None
    except ValueError as exc:
        raise _Bad(f"malformed JSON ({str(exc)[:_QUOTE_MAX]})") from None
    messages = _normalise(obj, check_unicode=_SURROGATE_ESCAPE.search(text) is not None)
    return _record_id(obj, messages), messages


def load_prompts(path: str | os.PathLike, on_bad_line: str = "error") -> PromptSet:
    """Read a prompts.jsonl file into a PromptSet (see the module docstring for the rules)."""
    if on_bad_line not in ON_BAD_LINE:
        raise ValueError(f"on_bad_line must be one of {ON_BAD_LINE}, got {on_bad_line!r}")
    path = os.fspath(path)
    if os.path.isdir(path):
        raise UserError(f"{path}: is a directory, expected a prompts file")
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise UserError(f"{path}: prompts file not found") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read prompts file ({exc.strerror or exc})") from None

    result = PromptSet(path=path, prompts=[], duplicates=0, skipped=[], lines=0)
    seen = {}  # id -> (messages, line)
    for lineno, raw in enumerate(data.split(b"\n"), start=1):
        if is_blank(raw):
            continue
        result.lines += 1
        try:
            pid, messages = _parse_line(raw, lineno)
            first = seen.get(pid)
            if first is not None:
                if first[0] == messages:
                    result.duplicates += 1
                    continue
                raise _Bad(duplicate_reason(pid, first[1]))
        except _Bad as exc:
            if on_bad_line == "error":
                raise UserError(f"{path}:{lineno}: {exc}") from None
            result.skipped.append((lineno, str(exc)))
            continue
        seen[pid] = (messages, lineno)
        result.prompts.append(Prompt(id=pid, messages=tuple(messages), line=lineno))

    if not result.prompts:
        first = result.skipped[0] if result.skipped else None
        raise UserError(f"{path}: {no_prompts_reason(len(result.skipped), first, bool(data))}")
    return result


def is_blank(raw: bytes) -> bool:
    """A line (bytes) that load_prompts ignores: whitespace only."""
    return not raw.strip() or (not raw.isascii() and _blank_unicode(raw))


def duplicate_reason(pid: str, first_line: int) -> str:
    """Why a line repeating an id with other messages is bad."""
    return f"duplicate id {_q(pid)} with different content (first seen on line {first_line})"


def no_prompts_reason(bad: int, first: tuple[int, str] | None, nonempty: bool) -> str:
    """Why a file yields no prompt: `bad` lines all bad, the first (line, reason); else blank or empty."""
    if bad:
        return f"no prompts found (all {bad} non-blank lines were bad; first: line {first[0]}: {first[1]})"
    return f"no prompts found ({'only blank lines' if nonempty else 'the file is empty'})"


def content_keys(prompt_list: Iterable[Prompt]) -> set[str]:
    """The normalised contents (stable_id of the messages) of prompts: the same under any id."""
    return {stable_id(p.messages) for p in prompt_list}


def without_earlier(pset: PromptSet, earlier_paths: Iterable[str | os.PathLike],
                    on_bad_line: str = "error") -> PromptSet:
    """`pset` less the prompts whose normalised content is in one of the `earlier_paths` prompts files
    (generation.dedup_across_datasets: each prompt kept in the first dataset only); counted in
    pset.in_earlier. One line when that leaves no prompt."""
    seen = set()
    for path in earlier_paths:
        seen |= content_keys(load_prompts(path, on_bad_line=on_bad_line).prompts)
    kept = [p for p in pset.prompts if stable_id(p.messages) not in seen]
    pset.in_earlier = len(pset.prompts) - len(kept)
    if not kept:
        raise UserError(f"{pset.path}: every prompt is in an earlier dataset (generation.dedup_across_datasets)")
    pset.prompts = kept
    return pset


def _blank_unicode(raw):
    """A non-ASCII line that decodes to whitespace only (e.g. a BOM-free NBSP line) is blank."""
    try:
        return not raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        return False


def dispatch_order(ids: Iterable[str], seed: int) -> list:
    """Ids in a seeded pseudo-random order, the same on every call and independent of file order.

    Each id's position depends only on (seed, id), so appending prompts never reorders existing ones.
    """
    return sorted(ids, key=lambda i: (hashlib.sha256(f"{seed}:{i}".encode()).hexdigest(), i))
