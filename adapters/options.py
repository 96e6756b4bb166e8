"""What every engine adapter does with its options and model directories, in one place.

Each error is one :class:`EngineError` naming the engine and the option or file at fault.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from .interface import EngineError, UnknownOption, refuse_unknown_options  # noqa: F401  (UnknownOption re-exported)

__all__ = ["check_known", "flag", "number", "choice", "read_config", "drafter_block_size", "cuda_device_count"]

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def check_known(engine: str, options: dict, known: Iterable[str]) -> None:
    """Refuse options the engine does not know (:class:`UnknownOption`), listing the ones it does."""
    refuse_unknown_options(engine, options, known)


def flag(engine: str, key: str, value) -> bool:
    """A boolean option: a bool, or one of 1/0, true/false, yes/no, on/off."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise EngineError(f"engine '{engine}': option {key} must be true or false, got {value!r}")


def number(engine: str, key: str, value, kind=int, low=None, high=None):
    """A numeric option of type ``kind``, optionally bounded (inclusive)."""
    try:
        result = kind(value)
    except (TypeError, ValueError):
        raise EngineError(f"engine '{engine}': option {key} must be {kind.__name__}, got {value!r}") from None
    if (low is not None and result < low) or (high is not None and result > high):
        bounds = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise EngineError(f"engine '{engine}': option {key} must be {bounds}, got {value!r}")
    return result


def choice(engine: str, key: str, value, choices: Iterable[str]) -> str:
    """A string option from a fixed set."""
    choices = tuple(choices)
    text = str(value).strip().lower()
    if text not in choices:
        raise EngineError(f"engine '{engine}': option {key} must be one of {', '.join(choices)}, got {value!r}")
    return text


def read_config(engine: str, directory: str, what: str) -> dict:
    """``directory/config.json`` as a dict (``what``: "target" or "drafter", for the message)."""
    path = Path(directory) / "config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise EngineError(f"engine '{engine}': cannot read the {what} config {path}: {exc}") from None
    if not isinstance(config, dict):
        raise EngineError(f"engine '{engine}': the {what} config {path} is not a JSON object")
    return config


def drafter_block_size(engine: str, drafter_dir: str) -> int:
    """The DFlash drafter's ``block_size`` (an int >= 2)."""
    block = read_config(engine, drafter_dir, "drafter").get("block_size")
    if not isinstance(block, int) or isinstance(block, bool) or block < 2:
        raise EngineError(
            f"engine '{engine}': drafter {drafter_dir}/config.json: block_size must be an int >= 2, got {block!r}"
        )
    return block


def cuda_device_count() -> int:
    """CUDA devices visible to torch here (0 without CUDA or with a broken install)."""
    try:
        import torch

        return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0
    except (ImportError, RuntimeError):
        return 0
