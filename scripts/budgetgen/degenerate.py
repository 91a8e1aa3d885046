"""Degenerate output: what a broken server sends with HTTP 200 (issue 42), told from one response's text.

Three tests, each a fact of the quality gate (budgetgen.quality.observe names them) and each a server
fault the breaker counts (budgetgen.breaker):

  looping(text)                 `repetition`: the text ends in a loop. Judged on its tails (the last
                                1,000, 2,000 and 4,000 characters, TAILS: a loop, once entered, runs to
                                max_tokens or a stop, so it lives at the end) and only where a tail is long
                                enough to say (MIN_CHARS): a short answer is never a loop. A loop is both
                                compressible (zlib's output under ZLIB_RATIO of the tail's bytes) and poor
                                in distinct n-grams (under DISTINCT_SHARE of its word 4-grams, or of its
                                character 12-grams where words are long or absent: CJK, URLs); one long
                                answer with a block repeated once passes both.
  replacement_chars(text, cut)  `replacement_chars`: U+FFFD in the text, the mark a detokenizer leaves for
                                bytes that are not UTF-8 (a wrong tokenizer, a broken incremental
                                detokenizer); one at the very end of a response cut at max_tokens (cut:
                                a multi-byte character split by the cut) is not counted.
  leaked_token(text, specials)  `template_leak`: one of the target tokenizer's own special tokens as text
                                (`<|im_end|>`, `<|im_start|>`: a server with the wrong chat template or
                                stop tokens, generating past the end of its turn). The reasoning tags are
                                not leaks (the reasoning facts judge them), nor is a token in quotes or
                                backticks (an answer about chat templates).

The thresholds were chosen by measurement (bench/bench_quality.py; bench/results/quality.md): the false
positives on natural responses and the detection of the loops and mojibake the mock server sends.
"""

from __future__ import annotations

import functools
import re
import zlib

TAILS = (1000, 2000, 4000)  # the tails judged: a loop entered late fills a short one, a long period a long one
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
        grams = [tail[i:i + 12] for i in range(len(tail) - 11)]
    return len(set(grams)) / len(grams) if grams else 1.0


def loop_metrics(tail: str, shortcut: bool = True) -> tuple[float, float] | None:
    """(zlib ratio, distinct n-gram share) of one tail, or None where it is too short to say. Runs of
    whitespace count as one space (a padded table or indented code compresses well without looping).
    `shortcut`: the share is not counted (1.0) where the ratio already passes."""
    if len(tail.strip()) < MIN_CHARS:
        return None
    tail = " ".join(tail.split())
    raw = tail.encode("utf-8", "surrogatepass")
    ratio = len(zlib.compress(raw, 6)) / len(raw)
    return ratio, (distinct_share(tail) if ratio < ZLIB_RATIO or not shortcut else 1.0)


def looping(text: str) -> bool:
    """Whether `text` ends in a loop (see the module docstring): any of its TAILS compressible under
    ZLIB_RATIO and poor in distinct n-grams under DISTINCT_SHARE."""
    for n in TAILS:
        m = loop_metrics(text[-n:])
        if m is not None and m[0] < ZLIB_RATIO and m[1] < DISTINCT_SHARE:
            return True
        if len(text) <= n:
            break
    return False


def replacement_chars(text: str, cut: bool = False) -> bool:
    """Whether `text` holds U+FFFD; a response `cut` at max_tokens may end with one (see above)."""
    if REPLACEMENT not in text:
        return False
    return not cut or REPLACEMENT in text.rstrip(REPLACEMENT)


@functools.lru_cache(maxsize=8)
def _pattern(specials: tuple[str, ...], exclude: tuple[str, ...]) -> re.Pattern | None:
    chosen = sorted((s for s in specials if s not in exclude), key=len, reverse=True)
    return re.compile("|".join(map(re.escape, chosen))) if chosen else None


QUOTES = "\"'`"


def leaked_token(text: str, specials: tuple[str, ...], exclude: tuple[str, ...] = ()) -> str | None:
    """The first of `specials` (special tokens' text) but `exclude` found in `text` as a server leaks it, or
    None: one pass over the text (a Llama tokenizer declares 256 of them; the pattern is built once). One
    right after a quote or backtick is quoted (an answer about chat templates writes `"<|im_end|>"`)."""
    pattern = _pattern(tuple(specials), tuple(exclude)) if specials else None
    if pattern is None:
        return None
    for found in pattern.finditer(text):
        if not found.start() or text[found.start() - 1] not in QUOTES:
            return found.group(0)
    return None
