"""The rows against the server's own counts: a row built from text must have the tokens the server says
it generated (issue 42).

A row rebuilt from a response's text (no server ids: budgetgen.rows' text fallback) is only right when
tokenizer.path is the served model's tokenizer, its chat template the one the server rendered with, and
the server returned all of the text the model generated. The server counts both sides in its usage:
`usage.completion_tokens` (every generated token, the reasoning tags and the stop token included) and
`usage.prompt_tokens` (the prompt as it rendered it). Each row of a response that was not cut at
tokenizer.max_length is held against them, exactly:

  completion  the row's supervised tokens (the generated turn rebuilt) == usage.completion_tokens
  prompt      the row's tokens before them (the prompt rendered here) == usage.prompt_tokens

A difference in one row is noise worth a count (a tokenizer that merges across the prompt/answer seam);
the same difference in most rows is a wrong setup, and the tokenize job refuses (Agreement.problem) in one
line naming what is most likely at fault and one example id:
  - the completions' ratio to the server's count far from 1 (4.4x): tokenizer.path is not the served
    model's tokenizer;
  - most completions off by the same few tokens (-1: llama.cpp's reasoning parser drops the whitespace
    after `</think>`): the server returned other text than it generated (its reasoning parser; the
    engine setting); the cure is the engine's own ids (server.return_token_ids) or the setting named;
  - most prompts off: the server renders with another chat template than tokenizer.path's.
`tokenizer.check_usage: false` turns it off (a server that counts usage some other way).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

MIN_ROWS = 10  # rows needed before a difference is called systematic
SYSTEMATIC_SHARE = 0.5  # a difference in more than this share of the rows is the setup's
RATIO_BAND = (0.8, 1.25)  # completions' median ratio outside it: another tokenizer


@dataclass
class Agreement:
    """What the rows built from text say against the server's usage (merged over batches)."""

    rows: int = 0
    completion: Counter = field(default_factory=Counter)  # usage - row tokens -> rows
    prompt: Counter = field(default_factory=Counter)
    ratio: Counter = field(default_factory=Counter)  # row / usage completion tokens, to 0.05 -> rows
    example: dict = field(default_factory=dict)  # ("c"|"p", difference) -> (id, row tokens, usage tokens)

    def add(self, rid: str, row_completion: int, usage_completion: object, row_prompt: int,
            usage_prompt: object) -> None:
        """One row built from text, not cut at max_length, and its record's usage."""
        if not isinstance(usage_completion, int) or usage_completion <= 0:
            return
        self.rows += 1
        dc = usage_completion - row_completion
        self.completion[dc] += 1
        self.example.setdefault(("c", dc), (rid, row_completion, usage_completion))
        self.ratio[round(row_completion / usage_completion / 0.05) * 0.05] += 1
        if isinstance(usage_prompt, int) and usage_prompt > 0:
            dp = usage_prompt - row_prompt
            self.prompt[dp] += 1
            self.example.setdefault(("p", dp), (rid, row_prompt, usage_prompt))

    def merge(self, other: Agreement) -> None:
        self.rows += other.rows
        self.completion.update(other.completion)
        self.prompt.update(other.prompt)
        self.ratio.update(other.ratio)
        for k, v in other.example.items():
            self.example.setdefault(k, v)

    def off(self) -> tuple[int, int]:
        """(rows whose completion differs from the server's count, rows whose prompt does)."""
        return self.rows - self.completion[0], sum(self.prompt.values()) - self.prompt[0]

    def median_ratio(self) -> float:
        half, seen = self.rows / 2, 0
        for value in sorted(self.ratio):
            seen += self.ratio[value]
            if seen >= half:
                return value
        return 1.0

    def problem(self, tokenizer_path: str, engine: str) -> str | None:
        """The refusal of a systematic difference (see the module docstring), or None."""
        if self.rows < MIN_ROWS:
            return None
        off_c, off_p = self.off()
        if off_c > SYSTEMATIC_SHARE * self.rows:
            ratio = self.median_ratio()
            d, n = max(((d, n) for d, n in self.completion.items() if d), key=lambda x: x[1])
            rid, mine, theirs = self.example[("c", d)]
            where = f"{off_c} of {self.rows} rows built from text ({off_c / self.rows:.0%}), e.g. {rid!r}: " \
                    f"{mine} tokens here, {theirs} by the server"
            if not RATIO_BAND[0] <= ratio <= RATIO_BAND[1]:
                return (f"tokenizer.path ({tokenizer_path}) is not the served model's tokenizer: the rows' completions "
                        f"have {ratio:.2f}x the server's usage.completion_tokens in {where}; point tokenizer.path at "
                        "the target model's tokenizer folder")
            return (f"the rows rebuilt from text differ from the tokens the server generated by {-d:+d} in {n} of "
                    f"{self.rows} rows ({where}): the server returned other text than its model generated (its "
                    f"reasoning parser; server.engine: {engine}; llama.cpp: server.engine llamacpp asks for "
                    "reasoning_format none, or start llama-server with --reasoning-format none), or tokenizer.path "
                    "is another revision; set server.return_token_ids to train on the server's own ids, or "
                    "tokenizer.check_usage: false if the server counts usage some other way")
        if off_p > SYSTEMATIC_SHARE * sum(self.prompt.values()):
            d, n = max(((d, n) for d, n in self.prompt.items() if d), key=lambda x: x[1])
            rid, mine, theirs = self.example[("p", d)]
            return (f"the prompts rendered with tokenizer.path's chat template ({tokenizer_path}) differ from the "
                    f"server's usage.prompt_tokens in {off_p} of {sum(self.prompt.values())} rows (by {-d:+d} in "
                    f"{n}; e.g. {rid!r}: {mine} tokens here, {theirs} by the server): the server renders with "
                    "another chat template (its --chat-template?); the rows would not be what the model saw")
        return None

    def describe(self) -> dict:
        """For tokenized.arrow's metadata: rows checked and off on each side."""
        off_c, off_p = self.off()
        return {"rows": self.rows, "completion_off": off_c, "prompt_off": off_p}
