"""The config's chat_template_kwargs against the target's chat template, at config time (issue 29).

A template option nobody reads is taken silently by the server and by apply_chat_template: a typo
(`enable_thinkng`) or Qwen's `enable_thinking` on a template that reads another name (Kimi's and
DeepSeek-V3.1's read `thinking`) would run to the end, labelled as the cell it is not. So, before any job:

- every key of every chat_template_kwargs of the config (generation.extra_body, datasets.D.extra_body,
  and the mixture cells' extra_body under generation.mixture.C / datasets.D.mixture.C) must be a
  variable the template reads: jinja2's own parser (jinja2.meta.find_undeclared_variables, in the
  environment transformers renders with) on the tokenizer's chat template (every named template of a
  tokenizer that has several); else one line naming the key, the variables the template does read and
  the closest of them (difflib);
- two cells of a dataset whose chat_template_kwargs differ must render different prompts (a short
  sample conversation through apply_chat_template, with the generation prompt), else the mixture
  would be a label only.

The check runs only where it is cheap and meaningful: some chat_template_kwargs are given, the
tokenizer is a local folder (state.looks_local) that loads (turn_format.load_tokenizer; one that does
not is reported by the tokenize job and onstart's check instead), and tokenizer.check_template_kwargs
is true (false: the server renders with a template of its own, `--chat-template`). A check that
passed is remembered per tokenizer files (their hash holds the template text) and kwargs, in the
process and in a marker file under cache_dir, so the Snakefile's parse in every job skips the load.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
from typing import TYPE_CHECKING

from .settings import dataset_mixture
from .state import looks_local
from .turn_format import load_tokenizer, prepare_messages, tokenizer_sha256

if TYPE_CHECKING:
    from collections.abc import Callable, Container, Iterable, Mapping
    from typing import Any

    from transformers import PreTrainedTokenizerBase

CHECK_VERSION = 1  # part of the cache key: a change of the rules here invalidates earlier passes
# What apply_chat_template itself hands the template (besides the tokenizer's special tokens): read,
# but not switches a user sets.
_APPLY_NAMES = frozenset({"messages", "tools", "documents", "add_generation_prompt"})
_ESCAPE = ("set tokenizer.check_template_kwargs: false only if the server renders with a chat template of "
           "its own (--chat-template) that tokenizer.path does not have")
_SAMPLES = (
    [{"role": "user", "content": "What is 2 + 2?"}],
    [{"role": "user", "content": "What is 2 + 2?"},
     {"role": "assistant", "content": "4.", "reasoning_content": "Two plus two is four."},
     {"role": "user", "content": "And 3 + 3?"}],
)
_passed = set()  # cache keys of checks that passed in this process


def kwargs_places(config: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """[(dotted config key of a chat_template_kwargs, its dict)] of every place the config gives one."""
    out = []

    def add(prefix, section):
        kwargs = ((section or {}).get("extra_body") or {}).get("chat_template_kwargs")
        if isinstance(kwargs, dict) and kwargs:
            out.append((f"{prefix}.extra_body.chat_template_kwargs", kwargs))
        for cell, own in sorted(((section or {}).get("mixture") or {}).items()):
            add(f"{prefix}.mixture.{cell}", own)

    add("generation", config["generation"])
    for ds in sorted(config["datasets"]):
        add(f"datasets.{ds}", config["datasets"][ds])
    return out


def template_variables(template: str) -> frozenset[str] | None:
    """The variables a chat template reads from its context (jinja2.meta, in transformers' environment,
    whose globals such as raise_exception are not among them); None if it does not compile."""
    import jinja2
    from jinja2 import meta

    try:
        from transformers.utils.chat_template_utils import _compile_jinja_template

        env = _compile_jinja_template(template).environment
    except ImportError:
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=["jinja2.ext.loopcontrols"])
    except Exception:  # a template that does not compile: tokenize reports it
        return None
    try:
        return frozenset(meta.find_undeclared_variables(env.parse(template)))
    except jinja2.TemplateError:
        return None


def tokenizer_templates(tokenizer: PreTrainedTokenizerBase) -> list[str]:
    """The chat template texts of a loaded tokenizer: one, or each of its named templates."""
    template = tokenizer.chat_template
    return list(template.values()) if isinstance(template, dict) else [template]


def key_problem(places: Iterable[tuple[str, Mapping[str, Any]]], variables: Container[str], switches: Iterable[str],
                path: str) -> str | None:
    """The first kwarg key that the template does not read, as one line; None if all are read.
    variables: what the template reads; switches: those a user would set (for the listing)."""
    for where, kwargs in places:
        for key in kwargs:
            if key in variables:
                continue
            close = difflib.get_close_matches(key, sorted(switches), n=1, cutoff=0.6)
            hint = f"did you mean {close[0]}? " if close else ""
            reads = ", ".join(sorted(switches)) or "nothing besides the messages"
            return (f"config key {where}.{key}: the chat template of tokenizer.path ({path}) does not read {key} "
                    f"({hint}it reads: {reads}); {_ESCAPE}")
    return None


def render_problem(config: dict[str, Any], render: Callable[[dict[str, Any]], list[str | None]]) -> str | None:
    """Two cells of a dataset whose chat_template_kwargs differ but render the same sample prompts, as
    one line; None otherwise. render(kwargs) -> [text or None per sample conversation]."""
    renders = {}
    for ds in sorted(config["datasets"]):
        cells = dataset_mixture(config, ds).cells
        by_kwargs = {}
        for cell in cells:
            by_kwargs.setdefault(json.dumps(cell.chat_template_kwargs, sort_keys=True), cell)
        if len(by_kwargs) < 2:
            continue
        texts = {k: renders.setdefault(k, render(json.loads(k))) for k in by_kwargs}
        usable = [i for i in range(len(_SAMPLES)) if all(t[i] is not None for t in texts.values())]
        if not usable:
            continue  # the template renders none of the samples: tokenize reports what it cannot render
        seen = {}
        for k, cell in by_kwargs.items():
            other = seen.setdefault(tuple(texts[k][i] for i in usable), cell)
            if other is not cell:
                where = f"datasets.{ds}.mixture" if config["datasets"][ds].get("mixture") else "generation.mixture"
                return (f"config key {where}: cells {other.name} and {cell.name} (dataset {ds}) render the same "
                        f"prompt: their chat_template_kwargs "
                        f"{json.dumps(other.chat_template_kwargs, sort_keys=True)} and {k} make no difference "
                        "to the chat "
                        f"template of tokenizer.path ({config['tokenizer']['path']}), so the cells would be a label "
                        f"only; {_ESCAPE}")
    return None


def check_tokenizer(config: dict[str, Any], tokenizer: PreTrainedTokenizerBase) -> str | None:
    """Both checks against a loaded tokenizer: one line, or None."""
    places = kwargs_places(config)
    variables = set()
    for template in tokenizer_templates(tokenizer):
        found = template_variables(template)
        if found is None:
            return None  # a template jinja2 cannot parse: the tokenize job reports it
        variables |= found
    switches = variables - _APPLY_NAMES - set(tokenizer.special_tokens_map)
    problem = key_problem(places, variables, switches, config["tokenizer"]["path"])
    if problem:
        return problem

    def render(kwargs):
        out = []
        for conv in _SAMPLES:
            try:
                out.append(tokenizer.apply_chat_template(prepare_messages(conv), tokenize=False,
                                                         add_generation_prompt=True, **kwargs))
            except Exception:  # a reserved key, a template that refuses the sample: not this check's call
                out.append(None)
        return out

    return render_problem(config, render)


def cache_key(config: dict[str, Any]) -> str:
    from importlib.metadata import PackageNotFoundError, version

    t = config["tokenizer"]
    try:
        transformers_version = version("transformers")
    except PackageNotFoundError:
        transformers_version = None
    cells = {ds: [[c.name, c.chat_template_kwargs] for c in dataset_mixture(config, ds).cells]
             for ds in sorted(config["datasets"])}
    blob = {"v": CHECK_VERSION, "tokenizer": tokenizer_sha256(t["path"]), "trust": bool(t["trust_remote_code"]),
            "places": kwargs_places(config), "cells": cells, "transformers": transformers_version}
    return hashlib.sha256(json.dumps(blob, sort_keys=True, default=str).encode()).hexdigest()


def template_problem(config: dict[str, Any], cache_dir: str | None = None) -> str | None:
    """The config's chat_template_kwargs checked against tokenizer.path's chat template (module
    docstring): one line naming the key, or None (also when the check does not apply). cache_dir: a
    folder for the markers of passed checks (None: remembered in this process only)."""
    t = config["tokenizer"]
    if not t["check_template_kwargs"] or not kwargs_places(config):
        return None
    path = os.fspath(t["path"])
    if not (looks_local(path) and os.path.isdir(path)):
        return None  # a hub name, or a folder not built yet: onstart's tokenizer check reports it
    key = cache_key(config)
    marker = os.path.join(cache_dir, key) if cache_dir else None
    if marker and os.path.exists(marker):
        return None
    if key not in _passed:
        from .errors import UserError

        try:
            tokenizer = load_tokenizer(path, t["trust_remote_code"])
        except UserError:
            return None  # the tokenize job (and onstart's check) says why it does not load
        problem = check_tokenizer(config, tokenizer)
        if problem:
            return problem
        _passed.add(key)
    if marker:
        try:
            os.makedirs(cache_dir, exist_ok=True)
            open(marker, "w").close()
        except OSError:
            pass
    return None
