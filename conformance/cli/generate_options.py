"""The options of ``ddtree-conformance generate`` (:mod:`.generate`) that no other command takes."""

from __future__ import annotations

from typing import Annotated, Any, Optional

import typer

from ..settings import GenerateSettings, shown_default
from . import options as opt

__all__ = ["Mode", "Budget", "MaxNewTokens", "Sampling", "Trace", "BatchSize", "GenerateOut"]


Mode = Annotated[
    Optional[str],
    typer.Option(
        "--mode", help="Decoding mode: plain | dflash | ddtree.", show_default=shown_default("mode", GenerateSettings)
    ),
]
Budget = Annotated[
    Optional[int],
    typer.Option(
        "--budget",
        "-B",
        help="DDTree node budget (non-root nodes).",
        show_default=shown_default("budget", GenerateSettings),
    ),
]
MaxNewTokens = Annotated[
    Optional[int],
    typer.Option(
        "--max-new-tokens",
        help="Tokens per prompt; overrides the prompt set's own limits. (default: the set's own, else 64)",
    ),
]
Temperature = Annotated[Optional[float], typer.Option("--temperature", "-t", help="0 = greedy.")]
TopP = Annotated[Optional[float], typer.Option("--top-p", help="Nucleus sampling mass, in (0, 1].")]
TopK = Annotated[Optional[int], typer.Option("--top-k", help="Top-k sampling; 0 disables.")]
Seed = Annotated[Optional[int], typer.Option("--seed", help="Per-request sampling seed.")]
StopToken = Annotated[
    Optional[list[int]],
    typer.Option(
        "--stop-token", help="Stop token id (repeatable). (default: the eos ids in the target's generation_config.json)"
    ),
]
Trace = Annotated[bool, typer.Option("--trace/--no-trace", help="Record per-round traces.")]
BatchSize = Annotated[
    Optional[int],
    typer.Option(
        "--batch-size", help="Prompts per generate call.", show_default=shown_default("batch_size", GenerateSettings)
    ),
]
GenerateOut = Annotated[
    Optional[str],  # a str: a Path drops the trailing '/' that names a folder still to be made
    typer.Option(
        "--out",
        "-o",
        help="Output JSONL; an existing folder, or a path ending in '/', gets the default name inside it.",
        show_default="reports/generate-<mode>.jsonl",
    ),
]


@opt.option_group
class Sampling:
    """How each request samples, and where it stops."""

    temperature: Temperature = None
    top_p: TopP = None
    top_k: TopK = None
    seed: Seed = None
    stop_token: StopToken = None

    def values(self) -> dict[str, Any]:
        return {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "seed": self.seed,
            "stop_token_ids": self.stop_token,
        }
