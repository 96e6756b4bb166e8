"""Misbehaving engines: each breaks the engine contract in one way a third-party engine might.

Most wrap the reference engine and corrupt what it returns in the speculative modes (plain stays
honest, so a message points at the broken run); the rest crash, hang or cannot start, and import
nothing heavy (no torch), so their process starts in about a second. The suite
must never pass any of them: a corrupt result fails the checks that use it with a message naming
the request and the field (:mod:`ddtree_conformance.integrity`), and an engine that cannot start
or dies stops the run with exit status 5. ``tests/test_misbehaving.py`` asserts each verdict and
exit status. They are engines like any other::

    ddtree-conformance check --engine ddtree_conformance.testing.misbehaving:OneResultTooFew

:data:`CATALOGUE` lists them with what each does wrong (plus one fault that is the user's: an
option the engine does not know).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from ddtree_conformance.adapters.interface import Capabilities, Engine, Request, RequestResult, RunConfig

__all__ = ["CATALOGUE", "Fault"]


def _log(text: str) -> None:
    """A line in the engine's log (stdout is the log file in an isolated engine's child)."""
    print(text, flush=True)


class _Corrupting(Engine):
    """The reference engine (built inside, so this module imports no torch), with :meth:`corrupt`
    applied to its speculative-mode results."""

    OPTIONS = ("builder",)

    def __init__(self, model_dir: str, drafter_dir: str | None = None, **options) -> None:
        super().__init__(model_dir, drafter_dir, **options)
        # imported here: it pulls torch and transformers, and this module loads light for the registry
        from ddtree_conformance.adapters.reference.engine import ReferenceEngine

        self.reference = ReferenceEngine(model_dir, drafter_dir, **options)
        self.vocab_size = self.reference.info.vocab_size
        self.name = f"misbehaving-{type(self).__name__}"

    def capabilities(self) -> Capabilities:
        return self.reference.capabilities().model_copy(update={"name": self.name})

    def corrupt(self, requests: list[Request], config: RunConfig, results: list[RequestResult]) -> list:
        raise NotImplementedError

    def generate(self, requests: list[Request], config: RunConfig) -> list:
        results = self.reference.generate(requests, config)
        return results if config.mode == "plain" else self.corrupt(requests, config, results)

    def close(self) -> None:
        self.reference.close()


class _Process(Engine):
    """An engine that fails as a process does; it never gets as far as computing anything."""

    def capabilities(self) -> Capabilities:
        return Capabilities(
            name=f"misbehaving-{type(self).__name__}",
            modes=["plain", "dflash", "ddtree"],
            dtypes=["float32"],
            devices=["cpu"],
            sampling=True,
            traces=False,
            per_round_acceptance=False,
        )

    def generate(self, requests: list[Request], config: RunConfig) -> list[RequestResult]:
        raise NotImplementedError


def _each(results: list[RequestResult], **update) -> list[RequestResult]:
    return [r.model_copy(update={k: (v(r) if callable(v) else v) for k, v in update.items()}) for r in results]


# ----------------------------------------------------------------------- corrupt results
class OneResultTooFew(_Corrupting):
    """Drops the last result of every batch."""

    def corrupt(self, requests, config, results):
        return results[:-1]


class OneResultTooMany(_Corrupting):
    """Returns the last result twice."""

    def corrupt(self, requests, config, results):
        return results + results[-1:]


class ResultsOutOfOrder(_Corrupting):
    """Returns a batch's results in reverse order."""

    def corrupt(self, requests, config, results):
        return results[::-1]


def _last_token(results: list[RequestResult], token: int) -> list[RequestResult]:
    """The last result of the batch with its last output token replaced (the others stay valid)."""
    last = results[-1]
    return results[:-1] + [last.model_copy(update={"output_ids": last.output_ids[:-1] + [token]})]


class NegativeOutputIds(_Corrupting):
    """Reports token id -5 as the last output token of a batch's last result."""

    def corrupt(self, requests, config, results):
        return _last_token(results, -5)


class IdsBeyondVocabulary(_Corrupting):
    """Reports a token id past the end of the target's vocabulary (vocabulary size + 4903) as the last
    output token of a batch's last result."""

    def corrupt(self, requests, config, results):
        return _last_token(results, self.vocab_size + 4903)


class OutputTooLong(_Corrupting):
    """Emits one token more than max_new_tokens allows."""

    def corrupt(self, requests, config, results):
        return _each(results, output_ids=lambda r: r.output_ids + r.output_ids[-1:])


class WrongFinishReason(_Corrupting):
    """Says "stop" for outputs that ended at the length limit (and "length" for stops)."""

    def corrupt(self, requests, config, results):
        return _each(results, finish_reason=lambda r: "length" if r.finish_reason == "stop" else "stop")


class EmitsPastStop(_Corrupting):
    """Keeps emitting after a stop token."""

    def corrupt(self, requests, config, results):
        return _each(
            results, output_ids=lambda r: r.output_ids + r.output_ids[:1] if r.finish_reason == "stop" else r.output_ids
        )


class Tau66(_Corrupting):
    """Reports 66 tokens accepted per round: far beyond what a drafter block can hold."""

    def corrupt(self, requests, config, results):
        return _each(results, acceptance_lengths=lambda r: [66] * len(r.acceptance_lengths or []))


class LengthsDoNotAddUp(_Corrupting):
    """Reports one round more than it ran (acceptance lengths no longer add up to the output)."""

    def corrupt(self, requests, config, results):
        return _each(
            results,
            acceptance_lengths=lambda r: (r.acceptance_lengths or []) + [1],
            rounds=lambda r: (r.rounds or 0) + 1,
        )


class PerRoundAcceptanceDropped(_Corrupting):
    """Promises per-round acceptance (capabilities) but returns none."""

    def corrupt(self, requests, config, results):
        return _each(results, acceptance_lengths=None, rounds=None)


class TracesDropped(_Corrupting):
    """Promises traces (capabilities) but returns none when asked."""

    def corrupt(self, requests, config, results):
        return _each(results, traces=None)


class GarbageTraces(_Corrupting):
    """Traces whose bonus tokens are not the tokens the output holds."""

    def corrupt(self, requests, config, results):
        vocab = self.vocab_size

        def garble(r: RequestResult):
            if r.traces is None:
                return None
            return [t.model_copy(update={"bonus": (t.bonus + 1) % vocab}) for t in r.traces]

        return _each(results, traces=garble)


class NonFiniteDrafterLogits(_Corrupting):
    """Traces whose first round reports a NaN drafter logit (row 0, token 0), as an fp16 overflow would."""

    def corrupt(self, requests, config, results):
        def poison(r: RequestResult):
            if not r.traces or r.traces[0].draft_logits is None:
                return r.traces
            rows = [list(row) for row in r.traces[0].draft_logits]
            rows[0][0] = float("nan")
            return [r.traces[0].model_copy(update={"draft_logits": rows}), *r.traces[1:]]

        return _each(results, traces=poison)


class NotResults(_Corrupting):
    """Returns plain dicts with a string where token ids belong, instead of RequestResult objects."""

    def corrupt(self, requests, config, results):
        return [{"output_ids": "not token ids", "finish_reason": "length"} for _ in results]


class NoAcceptanceData(_Corrupting):
    """Not broken, only uninformative: reports no acceptance data at all, and says so."""

    def capabilities(self) -> Capabilities:
        caps = super().capabilities()
        return caps.model_copy(update={"traces": False, "per_round_acceptance": False, "draft_logits": False})

    def corrupt(self, requests, config, results):
        return _each(
            results,
            acceptance_lengths=None,
            rounds=None,
            traces=None,
            mean_acceptance=None,
            per_position_acceptance=None,
        )


# --------------------------------------------------------------------------- processes
class CannotStart(_Process):
    """Raises in its constructor."""

    def __init__(self, *args, **kwargs) -> None:
        _log("looking for an accelerator (simulated)")
        raise RuntimeError("no accelerator found for this engine (simulated)")


class HangAtStart(_Process):
    """Never finishes starting."""

    def __init__(self, *args, **kwargs) -> None:
        _log("loading weights forever (simulated hang at start-up)")
        time.sleep(3600)


class HangInCapabilities(_Process):
    """capabilities() never answers."""

    def capabilities(self) -> Capabilities:
        _log("capabilities() called: hanging (simulated)")
        time.sleep(3600)
        raise AssertionError("unreachable")


class CrashInGenerate(_Process):
    """Dies in generate, as a segfault would (exit code 139), after writing to its log."""

    def generate(self, requests, config):
        _log("about to crash: simulated segfault in the engine's kernel")
        os._exit(139)


class HangInGenerate(_Process):
    """Starts a helper process (as SGLang starts its scheduler), then never answers generate.

    The helper does not watch its parent: only the kill of the engine's process group ends it.
    Option ``helper`` (default true): false starts none."""

    OPTIONS = ("helper",)

    def __init__(self, model_dir: str, drafter_dir: str | None = None, **options) -> None:
        super().__init__(model_dir, drafter_dir, **options)
        self.helper = str(options.get("helper", True)).lower() not in ("0", "false", "no", "off")

    def generate(self, requests, config):
        if self.helper:
            helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
            _log(f"started helper process {helper.pid}")
        _log("hanging in generate (simulated)")
        time.sleep(3600)
        return []


_DETACH = (
    "import subprocess, sys\n"
    "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(3600)'], start_new_session=True,\n"
    "                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
    "print(child.pid)\n"
)


class DetachedGrandchild(_Process):
    """Starts a grandchild that detaches (its own session; its parent exits, so it is reparented away
    from the engine), then answers every generate correctly (outputs of token 1). Nothing in its
    process group or its descendants holds the grandchild: only the engine's tree mark finds it. Option
    ``pid_file``: also write the grandchild's pid there."""

    OPTIONS = ("pid_file",)

    def generate(self, requests, config):
        if not getattr(self, "started", False):
            middle = subprocess.run([sys.executable, "-c", _DETACH], capture_output=True, text=True, check=True)
            pid = middle.stdout.strip()
            _log(f"started detached grandchild {pid}")
            if self.options.get("pid_file"):
                with open(self.options["pid_file"], "w") as handle:
                    handle.write(pid)
            self.started = True
        return [
            RequestResult(
                output_ids=[1] * r.max_new_tokens,
                finish_reason="length",
                rounds=r.max_new_tokens - 1,
                acceptance_lengths=[1] * (r.max_new_tokens - 1),
            )
            for r in requests
        ]


class OutOfMemory(_Process):
    """Killed by SIGKILL in generate, as the kernel's out-of-memory killer does (no memory is used)."""

    def generate(self, requests, config):
        _log("allocating the KV cache (simulated out of memory: the OOM killer sends SIGKILL)")
        os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)
        return []


@dataclass(frozen=True)
class Fault:
    """One entry of :data:`CATALOGUE`: the engine (``module:Class`` spec) and its options, what is
    wrong, and how it is best shown: the check families to run, in its own process or not, and the
    ``--engine-timeout`` (seconds) for the ones that hang."""

    engine: str
    fault: str
    options: dict = field(default_factory=dict)
    checks: tuple[str, ...] = ("lossless",)
    isolate: bool = False
    timeout: float | None = None

    def check_args(self) -> list[str]:
        """The ``ddtree-conformance check`` options that show this fault: engine, check families,
        engine options, isolation and timeout (the model, prompts and output are the caller's)."""
        args = ["--engine", self.engine]
        for family in self.checks:
            args += ["--check", family]
        for key, value in self.options.items():
            args += ["-O", f"{key}={value}"]
        args += [] if self.isolate else ["--no-isolate"]
        return args + (["--engine-timeout", f"{self.timeout:g}"] if self.timeout else [])


def catalogue_check_command(
    target: Path, drafter: Path, prompts: Path, golden_dir: Path, report: Path, run_seed: int | None = None
) -> list[str]:
    """The ``ddtree-conformance check`` command the catalogue's table and the verdict snapshot run each
    fault with (add :meth:`Fault.check_args`): a tiny pair, 8 new tokens, DDTree at B=4."""
    # this interpreter's suite, whether or not its console script is on PATH
    command = [sys.executable, "-m", "ddtree_conformance", "check", "--model", str(target), "--drafter", str(drafter)]
    command += ["--prompts", str(prompts), "--pair-name", "random", "--golden-dir", str(golden_dir)]
    command += ["--max-new-tokens", "8", "--modes", "ddtree", "--budgets", "4", "--out", str(report)]
    return command + ([] if run_seed is None else ["--run-seed", str(run_seed)])


def _spec(cls: type) -> str:
    return f"{__name__}:{cls.__name__}"


_DIES = ("lossless", "tree-structure")  # the first check meets the failure, the second is not run

CATALOGUE: dict[str, Fault] = {
    "one result too few": Fault(_spec(OneResultTooFew), "drops the last result of a batch"),
    "one result too many": Fault(_spec(OneResultTooMany), "returns a result twice"),
    "results out of order": Fault(
        _spec(ResultsOutOfOrder), "returns results in reverse order", checks=("tree-structure",)
    ),
    "negative output ids": Fault(_spec(NegativeOutputIds), "token id -5 in the output"),
    "ids beyond the vocabulary": Fault(_spec(IdsBeyondVocabulary), "token id past the vocabulary"),
    "output longer than max_new_tokens": Fault(_spec(OutputTooLong), "one token past max_new_tokens"),
    "wrong finish_reason": Fault(_spec(WrongFinishReason), "'stop' at the length limit"),
    "emits past a stop token": Fault(_spec(EmitsPastStop), "tokens after the stop token", checks=("stop-token",)),
    "tau 66 on a small block": Fault(_spec(Tau66), "acceptance lengths beyond the block size", checks=("acceptance",)),
    "acceptance lengths do not add up": Fault(_spec(LengthsDoNotAddUp), "one round more than the output holds"),
    "per-round acceptance dropped while promised": Fault(
        _spec(PerRoundAcceptanceDropped), "capabilities promise per-round acceptance", checks=("acceptance",)
    ),
    "traces dropped while promised": Fault(
        _spec(TracesDropped), "capabilities promise traces", checks=("tree-structure",)
    ),
    "garbage traces": Fault(
        _spec(GarbageTraces), "trace bonus tokens differ from the output", checks=("tree-structure",)
    ),
    "drafter logits that are not finite": Fault(
        _spec(NonFiniteDrafterLogits), "a NaN drafter logit in a traced round", checks=("tree-structure",)
    ),
    "results that are not RequestResults": Fault(_spec(NotResults), "dicts with a string for output_ids"),
    "no acceptance data (honest)": Fault(
        _spec(NoAcceptanceData),
        "reports none, and says so: not a fault, but the run is incomplete (exit 7) unless --allow-skip acceptance",
        checks=("lossless", "acceptance"),
    ),
    "cannot start": Fault(_spec(CannotStart), "raises in __init__", checks=_DIES, isolate=True, timeout=10),
    "hang at start-up": Fault(_spec(HangAtStart), "never finishes __init__", checks=_DIES, isolate=True, timeout=3),
    "hang in capabilities": Fault(
        _spec(HangInCapabilities), "capabilities() never answers", checks=_DIES, isolate=True, timeout=3
    ),
    "crash in generate": Fault(
        _spec(CrashInGenerate), "os._exit(139) in generate", checks=_DIES, isolate=True, timeout=10
    ),
    "hang in generate": Fault(
        _spec(HangInGenerate), "starts a helper process, then sleeps", checks=_DIES, isolate=True, timeout=5
    ),
    "detached grandchild": Fault(
        _spec(DetachedGrandchild),
        "starts a grandchild in its own session, then answers correctly",
        checks=("lossless",),
        isolate=True,
        timeout=120,
    ),
    "out of memory": Fault(
        _spec(OutOfMemory), "SIGKILL in generate, as the OOM killer sends", checks=_DIES, isolate=True, timeout=10
    ),
    "unknown option": Fault("reference", "a typo in an option name", {"bulider": "vectorized"}, isolate=True),
}
