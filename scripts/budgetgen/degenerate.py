"""Degenerate output: what a broken server sends with HTTP 200 (issue 42), told from one response's text.

Three tests, each a fact of the quality gate (budgetgen.quality.observe names them) and each a server
fault the breaker counts (budgetgen.breaker):

  looping(text)                 `repetition`: the text ends in a loop. Judged on its tail (the last
                                TAIL_CHARS characters: a loop, once entered, runs to max_tokens or a stop,
                                so it lives at the end) and only where the tail is long enough to say
                                (MIN_CHARS): a short answer is never a loop. A loop is both
                                compressible (zlib's output under ZLIB_RATIO of the tail's bytes) and poor
                                in distinct n-grams (under DISTINCT_SHARE of its word 4-grams, or of its
                                character 12-grams for text without spaces: CJK); one long answer with a
                                block repeated once passes both.
  replacement_chars(text, cut)  `replacement_chars`: U+FFFD in the text, the mark a detokenizer leaves for
                                bytes that are not UTF-8 (a wrong tokenizer, a broken incremental
                                detokenizer); one at the very end of a response cut at max_tokens (cut:
                                a multi-byte character split by the cut) is not counted.
  leaked_token(text, specials)  `template_leak`: one of the target tokenizer's own special tokens as text
                                (`<|im_end|>`, `<|im_start|>`: a server with the wrong chat template or
                                stop tokens, generating past the end of its turn). The reasoning tags are
                                not leaks (the reasoning facts judge them).

The thresholds were chosen by measurement (bench/bench_quality.py; bench/results/quality.md): the false
positives on natural responses and the detection of the loops and mojibake the mock server sends.
"""

from __future__ import annotations

import functools
import re
import zlib

TAIL_CHARS = 2000
MIN_CHARS = 400
ZLIB_RATIO = 0.2
DISTINCT_SHARE = 0.3
REPLACEMENT = "\ufffd"


def distinct_share(tail: str) -> float:
    """The share of distinct n-grams in `tail`: word 4-grams, or character 12-grams where the text has
    too few words for them (a script written without spaces)."""
    words = tail.split()
    if len(words) >= len(tail) / 20:
        grams = [tuple(words[i:i + 4]) for i in range(len(words) - 3)]
    else:
        grams = [tail[i:i + 12] for i in range(0, len(tail) - 11, 3)]
    return len(set(grams)) / len(grams) if grams else 1.0


def looping(text: str) -> bool:
    """Whether `text` ends in a loop (see the module docstring)."""
    tail = text[-TAIL_CHARS:]
    if len(tail.strip()) < MIN_CHARS:
        return False
    raw = tail.encode("utf-8", "surrogatepass")
    if len(zlib.compress(raw, 6)) >= ZLIB_RATIO * len(raw):
        return False
    return distinct_share(tail) < DISTINCT_SHARE


def replacement_chars(text: str, cut: bool = False) -> bool:
    """Whether `text` holds U+FFFD; a response `cut` at max_tokens may end with one (see above)."""
    if REPLACEMENT not in text:
        return False
    return not cut or REPLACEMENT in text.rstrip(REPLACEMENT)


@functools.lru_cache(maxsize=8)
def _pattern(specials: tuple[str, ...]) -> re.Pattern:
    return re.compile("|".join(re.escape(s) for s in sorted(specials, key=len, reverse=True)))


def leaked_token(text: str, specials: tuple[str, ...]) -> str | None:
    """The first of `specials` (special tokens' text) found in `text`, or None: one pass over the text
    (a Llama tokenizer declares 256 of them)."""
    if not specials:
        return None
    found = _pattern(specials).search(text)
    return found.group(0) if found else None
