"""What a session runs on: its settings, the prompt set, the requests built from it, and runs.

:class:`SuiteInputs` reads the prompt set once (formatted for the pair, cut to ``limit``), draws the
run's held-out prompts from the set's source (:mod:`ddtree_conformance.held_out`), builds
the default requests, and turns a mode and budget into a :class:`~ddtree_conformance.run.Run` with the
session's tensor-parallel size. :meth:`SuiteInputs.labels` names requests in messages.
"""

from __future__ import annotations

import math
from functools import cached_property

from ..adapters.interface import Mode, Request
from ..held_out import PromptSource, held_out_prompts, prompt_source
from ..prompts import Prompt, format_prompts, load_prompts
from ..run import Run
from ..scorer import TargetScorer
from ..settings import SuiteSettings

__all__ = ["SuiteInputs"]


class SuiteInputs:
    """The settings, prompts and requests of a session (module doc)."""

    def __init__(self, settings: SuiteSettings) -> None:
        self.settings = settings

    @cached_property
    def bundled(self) -> list[Prompt]:
        """The prompt set's prompts, formatted for the pair, cut to ``limit``."""
        s = self.settings
        prompts = load_prompts(s.prompt_set, tokenizer_dir=s.model_dir)
        prompts = format_prompts(prompts, s.model_dir, s.prompt_format)
        return prompts[: s.limit] if s.limit else prompts

    @cached_property
    def source(self) -> PromptSource:
        """Where this run's fresh prompts come from: the set's templates, or the target's own samples."""
        return prompt_source(self.settings, self.bundled)

    @cached_property
    def held_out(self) -> list[Prompt]:
        """Prompts drawn for this run (:mod:`ddtree_conformance.held_out`): ``held_out_prompts`` of them,
        else the share ``held_out_per_prompt`` of the set, at least one."""
        s = self.settings
        count = s.held_out_prompts
        if count is None:
            count = max(1, math.ceil(round(len(self.bundled) * s.held_out_per_prompt, 6)))
        return held_out_prompts(self.source, count, s.run_seed or 0)

    def fresh_ids(self, lengths: tuple[int, ...]) -> list[list[int]]:
        """One fresh prompt of exactly each of ``lengths`` tokens from the run's source, drawn from the run
        seed (the context-range check's prompts), the same each time it is asked for in a session."""
        memo = self.__dict__.setdefault("_fresh_ids", {})
        if lengths not in memo:
            memo[lengths] = self.source.long_ids(lengths, self.settings.run_seed or 0)
        return memo[lengths]

    def drawn_held_out(self) -> list[Prompt]:
        """The held-out prompts when the run has drawn them (for the report), else []: nothing is drawn."""
        return self.__dict__.get("held_out", [])

    @cached_property
    def prompts(self) -> list[Prompt]:
        """Every prompt of the run: the bundled ones, then the held-out ones."""
        return self.bundled + self.held_out

    def prepare(self) -> None:
        """A run's setup, before its first check: read the prompt set, draw the held-out prompts, build
        the default requests and index the prompts' labels, once. Whatever fails here is left as it
        was: nothing is cached, so each check that needs the prompts meets the same error and reports
        it as before (a prompt file that cannot be read: one line naming it,
        :func:`~ddtree_conformance.checks.runner.run_plan`)."""
        try:
            self.labels(self.requests())
        except Exception:  # noqa: BLE001 (reported by the checks, see above)
            pass

    def requests(self, **overrides) -> list[Request]:
        """One request per prompt: ``max_new_tokens`` from the settings, unless overridden. The default
        requests are built once (requests are frozen; each call gets its own list)."""
        if overrides:
            return self._build_requests(overrides)
        if "_default_requests" not in self.__dict__:
            self._default_requests = self._build_requests({})
        return list(self._default_requests)

    def _build_requests(self, overrides: dict) -> list[Request]:
        base = {"max_new_tokens": self.settings.max_new_tokens, **overrides}
        return [Request(prompt_ids=p.prompt_ids, **base) for p in self.prompts]

    def run(
        self,
        mode: Mode,
        budget: int | None = None,
        *,
        trace: bool = False,
        draft_logits: bool = False,
        tensor_parallel_size: int | None = None,
    ) -> Run:
        """The :class:`Run` of ``mode`` at ``budget``; the tensor-parallel size defaults to the settings'."""
        tp = tensor_parallel_size or self.settings.tensor_parallel_size
        return Run(mode, budget, trace=trace, draft_logits=draft_logits, tensor_parallel_size=tp)

    def labels(self, requests: list[Request]) -> list[str]:
        """How messages name each request: its prompt id when it is a prompt of the set."""
        ids = self._prompt_ids()
        out = []
        for r in requests:
            pid = ids.get(tuple(r.prompt_ids))
            if pid is not None:
                out.append(f"prompt {pid}")
            else:
                shown = ", ".join(map(str, r.prompt_ids[:6])) + (", ..." if len(r.prompt_ids) > 6 else "")
                out.append(f"prompt ids [{shown}]")
        return out

    def _prompt_ids(self) -> dict[tuple[int, ...], str]:
        """Prompt ids by token ids, indexed once; empty (not cached) while the prompt set cannot be read:
        requests are then named by their ids."""
        if "_ids" not in self.__dict__:
            try:
                self._ids = {tuple(p.prompt_ids): p.id for p in self.prompts}
            except Exception:  # noqa: BLE001 (the prompt set cannot be read: named by their ids)
                return {}
        return self._ids

    @cached_property
    def scorer(self) -> TargetScorer:
        """fp32 re-scorer of the target, on the session's device."""
        return TargetScorer(self.settings.model_dir, "float32", self.settings.device)
