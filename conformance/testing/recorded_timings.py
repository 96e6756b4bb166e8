"""An engine that replays per-repeat speedups recorded on an H200, so the sequential bench and the gate
can be tested end to end on any machine, with no timing of their own.

``RecordedTimings`` (``--engine ddtree_conformance.testing.recorded_timings:RecordedTimings -O
samples=NAME``) answers every request with ``max_new_tokens`` tokens and reports device-clock
timings: each plain step takes :data:`STEP_S`, and the k-th speculative call of each prompt (counting
from 0: run ``--no-warmup``, so call k of a prompt is repeat k) accepts one token per round at a round
time of ``STEP_S / samples[k]``, so repeat k's speedup is exactly ``samples[k]``, however many prompts
a repeat holds. Times are microseconds, always inside the wall clock of the call.

:data:`SAMPLES` were recorded by ``scripts/gate_decisiveness.py`` on a newly started H200
(scripts/measurements/2026-12-01-machine-a/decisive-8b: 8B-shaped pair, bf16, B=32, fast path): the
correct engine's 20-repeat baseline, a trial of the correct engine (pass after 5 repeats) and one
of the verify +5 % mutant (regression after 8); and the 20-repeat baselines of machines B, C and D
(``baseline-b`` .. ``baseline-d``), so a baseline of four runs on four machines has its real spread.
``-O round_scale=1.05`` makes every speculative round 5 % longer: a machine that drifted (issue 29: trials
+3.3 % to +8.6 % round time after a baseline taken in the first minute).
"""

from __future__ import annotations

from ddtree_conformance.adapters.interface import Capabilities, Engine, EngineError, RequestResult, Timings

__all__ = ["SAMPLES", "STEP_S", "RecordedTimings"]

STEP_S = 6.5e-6  # the H200's 6.5 ms plain step, in microseconds so no call outlasts its wall clock

SAMPLES = {
    "baseline": [
        0.59152,
        0.58478,
        0.58964,
        0.58479,
        0.58685,
        0.58701,
        0.58591,
        0.58657,
        0.58614,
        0.58379,
        0.58323,
        0.58127,
        0.61788,
        0.60776,
        0.5842,
        0.57824,
        0.60286,
        0.58923,
        0.59461,
        0.59518,
    ],
    "correct": [0.60113, 0.59656, 0.59207, 0.58947, 0.59324],
    "verify+5%": [0.56472, 0.56579, 0.57267, 0.56573, 0.57386, 0.57134, 0.56511, 0.56627],
    # the 20-repeat baselines of the three other newly started H200s (machines B, C, D, same settings)
    "baseline-b": [
        0.589293,
        0.609586,
        0.607159,
        0.597423,
        0.599573,
        0.604634,
        0.613108,
        0.608456,
        0.612415,
        0.612037,
        0.606036,
        0.60936,
        0.614673,
        0.604205,
        0.59822,
        0.609469,
        0.613945,
        0.611381,
        0.598675,
        0.607489,
    ],
    "baseline-c": [
        0.59382,
        0.597326,
        0.595014,
        0.598739,
        0.597488,
        0.597688,
        0.596763,
        0.597828,
        0.596192,
        0.597462,
        0.597127,
        0.596628,
        0.590143,
        0.591959,
        0.59386,
        0.594673,
        0.596768,
        0.596006,
        0.597358,
        0.596248,
    ],
    "baseline-d": [
        0.599406,
        0.605297,
        0.609119,
        0.602237,
        0.600523,
        0.600337,
        0.605153,
        0.596584,
        0.591008,
        0.593897,
        0.589785,
        0.593569,
        0.579888,
        0.57707,
        0.581014,
        0.587022,
        0.600156,
        0.607319,
        0.608216,
        0.607243,
    ],
}


class RecordedTimings(Engine):
    """Replays :data:`SAMPLES` ``[samples]`` as device-clock timings (module doc)."""

    name = "recorded-timings"
    OPTIONS = ("samples", "round_scale")

    def __init__(self, model_dir: str, drafter_dir: str | None = None, **options) -> None:
        super().__init__(model_dir, drafter_dir, **options)
        chosen = options.get("samples", "baseline")
        if chosen not in SAMPLES:
            raise EngineError(f"{self.name}: samples must be one of {', '.join(SAMPLES)}, got {chosen!r}")
        self.samples = SAMPLES[chosen]
        # every speculative round this much longer (a machine drifted since the samples were recorded)
        self.round_scale = float(options.get("round_scale", 1.0))
        if not 0.1 <= self.round_scale <= 10:
            raise EngineError(f"{self.name}: round_scale must be in [0.1, 10], got {self.round_scale}")
        self.calls: dict[tuple[int, ...], int] = {}  # speculative calls so far, per prompt

    def capabilities(self) -> Capabilities:
        return Capabilities(
            name=self.name,
            modes=["plain", "dflash", "ddtree"],
            dtypes=["float32"],
            devices=["cpu"],
            sampling=False,
            traces=False,
            per_round_acceptance=True,
        )

    def generate(self, requests, config):
        out = []
        for request in requests:
            decode = request.max_new_tokens - 1
            if config.mode == "plain":
                seconds = STEP_S * decode
            else:
                k = self.calls.get(tuple(request.prompt_ids), 0)
                seconds = STEP_S / self.samples[k % len(self.samples)] * decode * self.round_scale
                self.calls[tuple(request.prompt_ids)] = k + 1
            out.append(
                RequestResult(
                    output_ids=[1] * request.max_new_tokens,
                    finish_reason="length",
                    rounds=decode,
                    acceptance_lengths=[1] * decode,
                    timings=Timings(decode=seconds, stages={"round_device": seconds}),
                    engine_settings={"cuda_graphs": True, "attention_backend": "recorded"},
                )
            )
        return out
