"""The storage forecast of an EAGLE-3 hidden-state dump of the rows (what SpecForge and speculators
write before training a drafter offline): row tokens x captured layers x hidden size x dtype bytes,
captured layers being tokenizer.forecast_aux_layers auxiliary ones (3) and the last, at
tokenizer.forecast_dtype_bytes (2, bf16). The model's shape is read from its config.json
(tokenizer.model_config, or config.json in the tokenizer folder when that is the model's folder);
a multimodal config's text_config is read when the top level has no hidden_size."""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass

from .errors import UserError


@dataclass(frozen=True)
class DumpShape:
    hidden_size: int
    num_layers: int
    captured_layers: int
    dtype_bytes: int
    source: str

    @classmethod
    def from_config_file(cls, path: str | os.PathLike, aux_layers: int = 3, dtype_bytes: int = 2,
                         required: bool = False) -> DumpShape | None:
        """The shape from a config.json; None when the file is absent and not `required`
        (tokenizer.model_config names it), one line naming the file and key otherwise."""
        try:
            with open(path, encoding="utf-8") as f:
                cfg = json.load(f)
        except FileNotFoundError:
            if required:
                raise UserError(f"config key tokenizer.model_config: file not found: {path}") from None
            return None
        except (OSError, ValueError) as exc:
            raise UserError(f"{path}: not a readable config.json ({exc})") from None
        if not isinstance(cfg, dict):
            raise UserError(f"{path}: not a config.json object")
        if "hidden_size" not in cfg and isinstance(cfg.get("text_config"), dict):
            cfg = cfg["text_config"]
        try:
            hidden, layers = int(cfg["hidden_size"]), int(cfg["num_hidden_layers"])
        except KeyError as exc:
            if not required and os.path.basename(path) == "config.json":
                return None  # a tokenizer folder's config.json that is not a model's
            raise UserError(f"{path}: no {exc.args[0]} (needed for the storage forecast)") from None
        except (TypeError, ValueError):
            raise UserError(f"{path}: hidden_size and num_hidden_layers must be integers") from None
        return cls(hidden, layers, min(aux_layers, layers) + 1, int(dtype_bytes), os.fspath(path))

    @classmethod
    @functools.lru_cache(maxsize=8)
    def read(cls, path: str | os.PathLike, aux_layers: int = 3, dtype_bytes: int = 2,
             required: bool = False) -> DumpShape | None:
        """from_config_file, read once per process (the settings of every dataset name the same file)."""
        return cls.from_config_file(path, aux_layers, dtype_bytes, required)

    def bytes_for(self, tokens: float) -> int:
        """Bytes of the dump of `tokens` row tokens."""
        return int(tokens) * self.captured_layers * self.hidden_size * self.dtype_bytes

    def describe(self) -> str:
        return (f"{self.captured_layers} layers x hidden {self.hidden_size} x {self.dtype_bytes} B "
                f"(from {self.source})")


def human_bytes(n: float) -> str:
    """1.17 GB style (decimal units, as disks are sold)."""
    n = float(n)
    for unit in ("B", "kB", "MB", "GB", "TB", "PB"):
        if abs(n) < 1000 or unit == "PB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1000
    return f"{n:.2f} PB"
