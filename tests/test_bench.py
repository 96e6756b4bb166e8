"""bench: paired, interleaved repeats; the cost model; sequential stopping; the report it writes.

The statistics run on a synthetic engine whose step and round times are set (no timed
assertions); the CLI runs once on the tiny random pair.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from typer.testing import CliRunner

from ddtree_conformance.adapters.interface import Capabilities, Engine, Request, RequestResult, RunConfig, Timings
from ddtree_conformance.bench import Arm, BenchError, Stream, call_timing, measure, run_bench
from ddtree_conformance.cli import app
from ddtree_conformance.sequential import SequentialPlan, planned_looks
from ddtree_conformance.testing.random_pair import write_random_pair


class TimedEngine(Engine):
    """Synthetic engine: plain steps of ``step`` s, rounds of ``round`` s accepting ``tau`` tokens, with
    multiplicative log-normal noise of ``noise`` per call; records the call order."""

    name = "timed"

    def __init__(self, step=0.010, rounds=None, tau=3, noise=0.0, seed=0, clock="round_device", **options):
        super().__init__("m", "d")
        self.step, self.tau, self.noise, self.clock = step, tau, noise, clock
        self.round = rounds or {}
        self.rng = np.random.default_rng(seed)
        self.calls: list[tuple[str, int]] = []
        self.t = 0.0  # simulated clock: each request takes its reported time plus 1 ms

    def now(self) -> float:
        return self.t

    def capabilities(self) -> Capabilities:
        return Capabilities(
            name="timed",
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
            self.calls.append(
                (config.mode if config.mode != "ddtree" else f"ddtree-B{config.budget}", request.prompt_ids[0])
            )
            decode = request.max_new_tokens - 1
            if config.mode == "plain":
                lengths, per = [1] * decode, self.step
            else:
                lengths = [self.tau] * math.ceil(decode / self.tau)
                per = self.round.get(config.budget if config.mode == "ddtree" else None, 0.02)
            seconds = per * len(lengths) * math.exp(self.rng.normal(0, self.noise))
            self.t += seconds + 0.001
            stages = {self.clock: seconds} if self.clock else {}
            out.append(
                RequestResult(
                    output_ids=[1] * request.max_new_tokens,
                    finish_reason="length",
                    rounds=len(lengths),
                    acceptance_lengths=lengths,
                    timings=Timings(prefill=0.001, decode=seconds, stages=stages),
                )
            )
        return out


REQUESTS = [Request(prompt_ids=[i + 1, 2], max_new_tokens=13) for i in range(3)]


def config(mode, budget):
    return RunConfig(mode=mode, budget=budget or 1)


def test_cost_model_speedup_is_tau_times_step_over_round():
    engine = TimedEngine(step=0.010, rounds={16: 0.020}, tau=3)
    out = run_bench(engine, REQUESTS, config, [("ddtree", 16)], repeats=3, now=engine.now)
    run = out["runs"][1]
    assert out["bench"]["clock"] == "device" and out["bench"]["repeats"] == 3
    assert run["cost_model"]["tau"] == pytest.approx(3.0) and run["cost_model"]["tau_constant"]
    assert run["cost_model"]["step_s"] == pytest.approx(0.010) and run["cost_model"]["round_s"] == pytest.approx(0.020)
    assert run["cost_model"]["step_over_round"]["estimate"] == pytest.approx(0.5)
    sp = run["speedup"]
    assert sp["estimate"] == pytest.approx(1.5) and sp["ci_low"] == pytest.approx(1.5) == sp["ci_high"]
    assert sp["samples"] == [1.5] * 3 and sp["stop"]["decision"] == "fixed" and not sp["sequential"]
    assert run["tau"] == pytest.approx(3.0) and sum(run["histogram"].values()) == run["rounds"]


def test_repeats_are_paired_and_interleaved():
    engine = TimedEngine(rounds={4: 0.02, 8: 0.02})
    run_bench(engine, REQUESTS, config, [("dflash", None), ("ddtree", 4)], repeats=2, warmup=False, now=engine.now)
    primed, calls = engine.calls[:3], engine.calls[3:]
    # no warm-up: one untimed call per config on the first request right before the timed repeats
    assert sorted(c[0] for c in primed) == ["ddtree-B4", "dflash", "plain"] and len({c[1] for c in primed}) == 1
    assert len(calls) == 2 * 3 * 3  # repeats x requests x (plain + 2 methods)
    groups = [calls[i : i + 3] for i in range(0, len(calls), 3)]
    for index, group in enumerate(groups):  # one request per group, every config once
        assert len({prompt for _, prompt in group}) == 1 and sorted(c for c, _ in group) == sorted(
            ["plain", "dflash", "ddtree-B4"]
        )
        r, i = divmod(index, 3)
        assert (group[0][0] == "plain") == ((r + i) % 2 == 0) and (group[-1][0] == "plain") == ((r + i) % 2 == 1)
    # methods rotate between repeats
    assert [c for c, _ in groups[0] if c != "plain"] != [c for c, _ in groups[3] if c != "plain"]


@pytest.mark.parametrize("edge, decision", [(1.40, "pass"), (1.60, "regression")])
def test_sequential_stops_when_the_interval_clears_the_edge(edge, decision):
    engine = TimedEngine(rounds={16: 0.020}, tau=3, noise=0.01, seed=1)  # true speedup 1.5
    plan = SequentialPlan(min_repeats=3, max_repeats=40, time_budget_s=1e9)
    out = run_bench(engine, REQUESTS, config, [("ddtree", 16)], edges={"ddtree-B16": edge}, plan=plan, now=engine.now)
    sp = out["runs"][1]["speedup"]
    assert sp["sequential"] and sp["stop"]["decision"] == decision
    assert sp["stop"]["repeats"] == len(sp["samples"]) < 40
    assert sp["looks"] == sp["stop"]["repeats"] - 2 and sp["edge"] == edge
    assert (sp["ci_low"] >= edge) if decision == "pass" else (sp["ci_high"] < edge)


def test_sequential_runs_out_of_time_inconclusive():
    engine = TimedEngine(rounds={16: 0.020}, tau=3, noise=0.01, seed=2)
    plan = SequentialPlan(min_repeats=3, max_repeats=1000, time_budget_s=5)  # a repeat "takes" ~0.6 s
    out = run_bench(engine, REQUESTS, config, [("ddtree", 16)], edges={"ddtree-B16": 1.5}, plan=plan, now=engine.now)
    sp = out["runs"][1]["speedup"]
    assert sp["stop"]["decision"] == "inconclusive" and "time budget 5 s spent" in sp["stop"]["reason"]
    # re-planned after 3 repeats: the cap is what 5 s hold at their pace, so the run ends within a repeat of it
    assert 4.3 <= sp["stop"]["elapsed_s"] < 6 and sp["stop"]["repeats"] == sp["max_repeats"] < 1000
    assert sp["looks_planned"] == len(planned_looks(3, sp["max_repeats"], 1.5)) < len(planned_looks(3, 1000, 1.5))
    assert out["bench"]["plan"]["max_repeats_from_budget"] is True
    assert sp["ci_low"] < 1.5 <= sp["ci_high"]


def test_decided_runs_stop_and_the_others_go_on():
    engine = TimedEngine(rounds={4: 0.020, 8: 0.0201}, tau=3, noise=0.01, seed=3)
    plan = SequentialPlan(min_repeats=3, max_repeats=12, time_budget_s=1e9)
    out = run_bench(
        engine,
        REQUESTS,
        config,
        [("ddtree", 4), ("ddtree", 8)],
        edges={"ddtree-B4": 1.0, "ddtree-B8": 1.49},
        plan=plan,
        now=engine.now,
    )
    easy, hard = out["runs"][1]["speedup"], out["runs"][2]["speedup"]
    assert easy["stop"]["decision"] == "pass" and easy["stop"]["repeats"] == 3
    assert hard["stop"]["repeats"] > 3 and len(hard["samples"]) == hard["stop"]["repeats"]


@pytest.mark.parametrize("clock, expected", [("round_wall", "engine"), (None, "engine")])
def test_clock_falls_back_to_the_engine_clock(clock, expected):
    engine = TimedEngine(rounds={16: 0.020}, clock=clock)
    out = run_bench(engine, REQUESTS, config, [("ddtree", 16)], repeats=2, now=engine.now)
    assert out["bench"]["clock"] == expected
    assert out["runs"][1]["speedup"]["estimate"] == pytest.approx(1.5)


def test_call_clock_without_timings():
    result = RequestResult(output_ids=[1, 2, 3], finish_reason="length", rounds=None)
    timing = call_timing([result], wall_s=0.3)
    assert (timing.clock, timing.seconds, timing.rounds, timing.tokens) == ("call", 0.3, None, 3)


def test_engine_time_longer_than_the_call_is_refused():
    result = RequestResult(
        output_ids=[1, 2, 3],
        finish_reason="length",
        rounds=2,
        timings=Timings(prefill=0.0, decode=0.5, stages={"round_device": 0.5}),
    )
    with pytest.raises(
        BenchError,
        match=r"reports 0\.500000 s of decoding \(device clock\) in a generate call that "
        r"took 0\.100000 s",
    ):
        call_timing([result], wall_s=0.1)
    assert call_timing([result], wall_s=0.5).seconds == 0.5


def test_the_speedup_does_not_move_with_the_rounds_an_engine_reports():
    """Halving the reported rounds doubles tau and the round time; tau x step / round stays."""

    class FewerRounds(TimedEngine):
        def generate(self, requests, config):
            return [
                r.model_copy(update={"rounds": max(1, (r.rounds or 0) // 2), "acceptance_lengths": None})
                if config.mode != "plain"
                else r
                for r in super().generate(requests, config)
            ]

    honest, liar = TimedEngine(rounds={16: 0.020}), FewerRounds(rounds={16: 0.020})
    a = run_bench(honest, REQUESTS, config, [("ddtree", 16)], repeats=2, now=honest.now)["runs"][1]
    b = run_bench(liar, REQUESTS, config, [("ddtree", 16)], repeats=2, now=liar.now)["runs"][1]
    assert a["speedup"]["estimate"] == pytest.approx(b["speedup"]["estimate"]) == pytest.approx(1.5)
    assert b["cost_model"]["tau"] == pytest.approx(2 * a["cost_model"]["tau"])


def test_a_cut_last_round_counts_the_tokens_it_emitted_not_the_length_claimed():
    """12 decode tokens in rounds of 5: the last round emits 2. An engine that claims it accepted the
    whole block there (16, which no output can contradict) gets the same tau as an honest one."""

    class ClaimsAFullLastRound(TimedEngine):
        def generate(self, requests, config):
            return [
                r.model_copy(update={"acceptance_lengths": r.acceptance_lengths[:-1] + [16]})
                if config.mode != "plain"
                else r
                for r in super().generate(requests, config)
            ]

    honest, liar = TimedEngine(tau=5), ClaimsAFullLastRound(tau=5)
    a = run_bench(honest, REQUESTS, config, [("ddtree", 16)], repeats=2, now=honest.now)["runs"][1]
    b = run_bench(liar, REQUESTS, config, [("ddtree", 16)], repeats=2, now=liar.now)["runs"][1]
    for run in (a, b):
        assert run["tau"] == pytest.approx(4.0) == pytest.approx(run["cost_model"]["tau"])  # 12 tokens / 3 rounds
        assert run["histogram"] == {"2": 3, "5": 6} and run["per_position"][:2] == pytest.approx([1.0, 6 / 9])


def test_failed_requests_and_empty_decode_are_errors():
    class Failing(TimedEngine):
        def generate(self, requests, config):
            return [RequestResult(output_ids=[], finish_reason="error", error="boom\nout of memory")]

    with pytest.raises(BenchError, match="1 of 1 requests failed .out of memory"):
        run_bench(Failing(), REQUESTS, config, [("ddtree", 16)], repeats=2)
    short = [Request(prompt_ids=[1], max_new_tokens=1)]
    engine = TimedEngine()
    with pytest.raises(BenchError, match="no decode tokens"):
        run_bench(engine, short, config, [("ddtree", 16)], repeats=2, now=engine.now)


# -------------------------------------------------------------------------- engine settings, GPU busy, A/B
class SettingsEngine(TimedEngine):
    """Reports engine settings (``flip``: CUDA graphs on and off in alternate calls) and, on a profiled
    call, a GPU-busy time of ``busy`` x its decode time."""

    def __init__(self, graphs=True, flip=False, busy=None, **kw):
        super().__init__(**kw)
        self.graphs, self.flip, self.busy, self.profiled = graphs, flip, busy, 0

    def generate(self, requests, config):
        out = super().generate(requests, config)
        if self.flip:
            self.graphs = not self.graphs
        stages = {}
        if config.profile and self.busy is not None:
            self.profiled += 1
            stages = {"gpu_busy": self.busy * out[0].timings.stages["round_device"]}
        return [
            r.model_copy(
                update={
                    "engine_settings": {"cuda_graphs": self.graphs, "attention_backend": "x"},
                    "timings": r.timings.model_copy(update={"stages": {**r.timings.stages, **stages}}),
                }
            )
            for r in out
        ]


def gpu_config(mode, budget):
    return RunConfig(mode=mode, budget=budget or 1, device="cuda:0")


def test_bench_records_the_engine_settings_and_warns_on_an_eager_gpu_run():
    engine = SettingsEngine(graphs=False)
    out = run_bench(engine, REQUESTS, gpu_config, [("ddtree", 16)], repeats=2, now=engine.now, probe_busy=False)
    assert out["bench"]["engine_settings"] == {
        "cuda_graphs": False,
        "attention_backend": "x",
        "dtype": "float32",
        "tensor_parallel_size": 1,
    }
    assert out["runs"][1]["engine_settings"]["cuda_graphs"] is False
    assert any(w.startswith("eager-mode GPU run") for w in out["bench"]["warnings"])
    assert "WARNING: eager-mode GPU run" in out["bench"]["timing_basis"]
    graphs = SettingsEngine(graphs=True)
    fine = run_bench(graphs, REQUESTS, gpu_config, [("ddtree", 16)], repeats=2, now=graphs.now, probe_busy=False)
    assert fine["bench"]["warnings"] == []
    on_cpu = run_bench(engine, REQUESTS, config, [("ddtree", 16)], repeats=2, now=engine.now)
    assert on_cpu["bench"]["warnings"] == []  # eager is what a CPU runs
    silent = TimedEngine()
    unknown = run_bench(silent, REQUESTS, gpu_config, [("ddtree", 16)], repeats=2, now=silent.now, probe_busy=False)
    assert any("does not report whether it ran under CUDA graphs" in w for w in unknown["bench"]["warnings"])


def test_settings_that_change_within_a_run_are_mixed_and_warned():
    engine = SettingsEngine(flip=True)
    out = run_bench(engine, REQUESTS, config, [("ddtree", 16)], repeats=2, now=engine.now)
    assert out["bench"]["engine_settings"]["cuda_graphs"] == "mixed"
    assert any("settings changed within the run (cuda_graphs)" in w for w in out["bench"]["warnings"])


def test_gpu_busy_share_comes_from_one_profiled_call_per_run():
    engine = SettingsEngine(busy=0.8)
    out = run_bench(engine, REQUESTS, gpu_config, [("ddtree", 16)], repeats=2, now=engine.now)
    assert engine.profiled == 2 and [r["gpu_busy_share"] for r in out["runs"]] == [0.8, 0.8]
    assert "GPU busy (one profiled call): plain 80%, ddtree-B16 80%" in out["bench"]["timing_basis"]


def test_measure_interleaves_two_engines_for_an_ab_comparison():
    """What an A/B bench builds on: arms from two engine builds, one stream of B's speedup over A's. B's
    rounds cost 5 % more, so its speedup ratio is about 0.95 and a 2 % edge calls it a regression."""
    a, b = TimedEngine(rounds={16: 0.020}, noise=0.005, seed=1), TimedEngine(rounds={16: 0.021}, noise=0.005, seed=2)
    arms = [
        Arm("A:plain", a, config("plain", None)),
        Arm("A:ddtree-B16", a, config("ddtree", 16)),
        Arm("B:plain", b, config("plain", None)),
        Arm("B:ddtree-B16", b, config("ddtree", 16)),
    ]
    stream = Stream(
        "B/A ddtree-B16",
        tuple(arm.label for arm in arms),
        lambda rep: rep.sample("B:ddtree-B16", "B:plain")["speedup"] / rep.sample("A:ddtree-B16", "A:plain")["speedup"],
        edge=0.98,
    )
    measured = measure(
        arms, REQUESTS, [stream], plan=SequentialPlan(max_repeats=30, time_budget_s=1e9), now=lambda: a.t + b.t
    )  # one simulated clock for both engines
    stop = measured.stop["B/A ddtree-B16"]
    assert stop["decision"] == "regression"
    # warm-up rounds (until steady), then every request once through every arm per repeat, paired within the
    # request
    rounds = measured.warmup["rounds"]
    assert measured.warmup["steady"] is not None and 2 <= rounds <= 8
    assert len(a.calls) == len(b.calls) == 2 * rounds + stop["repeats"] * len(REQUESTS) * 2


# -------------------------------------------------------------------------- CLI, tiny real pair


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return write_random_pair(tmp_path_factory.mktemp("bench-pair"))


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    path = tmp_path_factory.mktemp("bench-prompts") / "p.jsonl"
    path.write_text(
        '{"id": "a", "category": "math", "prompt_ids": [1, 2, 3, 4]}\n'
        '{"id": "b", "category": "code", "prompt_ids": [5, 6, 7]}\n'
    )
    return path


def bench_args(pair, prompts, out, *extra):
    target, drafter = pair
    return [
        str(a)
        for a in (
            "bench",
            "--model",
            target,
            "--drafter",
            drafter,
            "--prompts",
            prompts,
            "--pair-name",
            "random",
            "--max-new-tokens",
            "6",
            "--budgets",
            "4",
            "--no-isolate",
            "--out",
            out,
            "--hardware-class",
            "test-cpu",
            *extra,
        )
    ]


def test_bench_writes_report_with_schema_and_three_files(pair, prompts, tmp_path):
    out = tmp_path / "reports" / "bench.json"
    result = CliRunner().invoke(app, bench_args(pair, prompts, out, "--repeats", "3"))
    assert result.exit_code == 0, result.output
    assert out.is_file() and out.with_suffix(".md").is_file() and out.with_suffix(".html").is_file()
    report = json.loads(out.read_text())
    assert report["schema"] == "ddtree-conformance/run-report" and report["schema_version"] == 1
    assert report["kind"] == "bench" and report["hardware_class"] == "test-cpu"
    assert report["bench"]["repeats"] == 3 and report["bench"]["clock"] == "engine"  # CPU: the engine's host clock
    assert [r["label"] for r in report["runs"]] == ["plain", "dflash", "ddtree-B4"]
    for run in report["runs"][1:]:
        sp, cm = run["speedup"], run["cost_model"]
        assert len(sp["samples"]) == 3 and sp["ci_low"] <= sp["estimate"] <= sp["ci_high"]
        assert sp["confidence"] == 0.95 and sp["cv"] is not None and sp["stop"]["decision"] == "fixed"
        assert sum(run["histogram"].values()) == run["rounds"]
        # the cost model: each repeat's speedup is tau x step / round; tau counts emitted tokens
        assert sp["samples"] == pytest.approx([cm["tau"] * r for r in cm["step_over_round"]["samples"]], rel=1e-4)
        assert 1.0 <= cm["tau"] == pytest.approx(run["tau"]) and cm["tau_constant"]
    # the report is accepted by baseline + gate: its own baseline passes tau, per-position and speedup
    bl = tmp_path / "bl"
    assert CliRunner().invoke(app, ["baseline", str(out), "--baselines", str(bl)]).exit_code == 0
    gated = CliRunner().invoke(app, ["gate", str(out), "--baselines", str(bl)])
    assert gated.exit_code == 0, gated.output


RECORDED = "ddtree_conformance.testing.recorded_timings:RecordedTimings"


def recorded_args(pair, prompts, out, samples, *extra):
    """bench of the engine that replays per-repeat speedups recorded on an H200: one prompt (and the run's
    held-out one), no warm-up, so repeat k is recorded sample k (no timing of this machine enters the numbers)."""
    target, drafter = pair
    one = prompts.parent / "one.jsonl"
    one.write_text(prompts.read_text().splitlines()[0] + "\n")
    return [
        str(a)
        for a in (
            "bench",
            "--engine",
            RECORDED,
            "-O",
            f"samples={samples}",
            "--model",
            target,
            "--drafter",
            drafter,
            "--prompts",
            one,
            "--pair-name",
            "recorded",
            "--max-new-tokens",
            "9",
            "--modes",
            "ddtree",
            "--budgets",
            "32",
            "--no-isolate",
            "--no-warmup",
            "--out",
            out,
            "--hardware-class",
            "test-h200",
            *extra,
        )
    ]


@pytest.mark.parametrize(
    "samples, decision, repeats, code", [("correct", "pass", 5, 0), ("verify+5%", "inconclusive", 8, 3)]
)
def test_sequential_bench_and_gate_on_samples_recorded_on_an_h200(
    pair, prompts, tmp_path, samples, decision, repeats, code
):
    """The whole chain (bench -> baseline -> sequential bench -> gate) on recorded samples: the baseline's
    20 repeats and one trial each of the correct engine and the verify +5 % mutant, as the H200 trial
    decided them (scripts/measurements/2026-12-01-machine-a). Deterministic: no clock of this machine.
    A baseline of one run has no between-run spread, so the gate does not fail the mutant on it (exit 3,
    saying what decides it: more baseline runs, or A/B)."""
    base = tmp_path / "base.json"
    made = CliRunner().invoke(app, recorded_args(pair, prompts, base, "baseline", "--repeats", "20"))
    assert made.exit_code == 0, made.output
    bl = tmp_path / "bl"
    assert CliRunner().invoke(app, ["baseline", str(base), "--baselines", str(bl)]).exit_code == 0
    out = tmp_path / "seq.json"
    result = CliRunner().invoke(app, recorded_args(pair, prompts, out, samples, "--baselines", bl))
    assert result.exit_code == 0, result.output
    sp = json.loads(out.read_text())["runs"][1]["speedup"]
    assert sp["sequential"] and sp["stop"]["decision"] == decision and sp["stop"]["repeats"] == repeats
    gated = CliRunner().invoke(app, ["gate", str(out), "--baselines", str(bl)])
    assert gated.exit_code == code, gated.output
    assert "MDE" in gated.stdout
    assert "machine during the bench:" in gated.stdout
    if code == 3:
        assert "records 1 run" in " ".join(gated.stdout.split())


def test_bench_rejects_bad_options(pair, prompts, tmp_path):
    result = CliRunner().invoke(app, bench_args(pair, prompts, tmp_path / "x.json", "--repeats", "1"))
    assert result.exit_code == 2 and "--repeats" in result.stderr
    result = CliRunner().invoke(app, bench_args(pair, prompts, tmp_path / "x.json", "--alpha", "0.7"))
    assert result.exit_code == 2 and "alpha" in result.stderr
    bad = tmp_path / "bad" / "test-cpu.json"
    bad.parent.mkdir()
    bad.write_text("{}")
    result = CliRunner().invoke(app, bench_args(pair, prompts, tmp_path / "x.json", "--baselines", bad.parent))
    assert result.exit_code == 2 and "bad/test-cpu.json" in result.stderr


def test_bench_without_a_baseline_runs_fixed_repeats(pair, prompts, tmp_path):
    out = tmp_path / "fixed.json"
    result = CliRunner().invoke(
        app, bench_args(pair, prompts, out, "--modes", "ddtree", "--repeats", "2", "--baselines", tmp_path / "none")
    )
    assert result.exit_code == 0, result.output
    assert "no baseline file" in result.stderr
    sp = json.loads(out.read_text())["runs"][1]["speedup"]
    assert not sp["sequential"] and sp["stop"]["decision"] == "fixed" and len(sp["samples"]) == 2


def test_a_drifted_machine_against_two_recorded_h200_runs_is_not_failed(pair, prompts, tmp_path):
    """The CLI path CI takes: two H200 baselines (machines A and B) made into one baseline of two runs by
    `baseline`, then the correct build on a machine whose rounds drifted 8.6 % slower (issue 29): the
    sequential bench stops at its first look (the spread alone spans the edge) and the gate says
    inconclusive, naming A/B, where a one-run baseline's gate used to fail it (scripts/drift_replay.py
    replays all four machines)."""
    reports = []
    for samples in ("baseline", "baseline-b"):
        reports.append(tmp_path / f"{samples}.json")
        made = CliRunner().invoke(app, recorded_args(pair, prompts, reports[-1], samples, "--repeats", "20"))
        assert made.exit_code == 0, made.output
    bl = tmp_path / "bl"
    made = CliRunner().invoke(app, ["baseline", *map(str, reports), "--baselines", str(bl)])
    assert made.exit_code == 0 and "2 runs, spread 1.93 %" in made.output, made.output
    out = tmp_path / "drifted.json"
    result = CliRunner().invoke(
        app, recorded_args(pair, prompts, out, "correct", "-O", "round_scale=1.086", "--baselines", bl)
    )
    assert result.exit_code == 0, result.output
    sp = json.loads(out.read_text())["runs"][1]["speedup"]
    assert sp["stop"]["decision"] == "inconclusive" and sp["stop"]["repeats"] == 3
    assert "spread alone" in sp["stop"]["reason"] and sp["spread"]["df"] == 1
    gated = CliRunner().invoke(app, ["gate", str(out), "--baselines", str(bl)])
    assert gated.exit_code == 3, gated.output
    assert "bench --against" in " ".join(gated.stdout.split())


def test_bench_out_naming_a_folder_still_to_be_made_creates_it_and_writes_inside(pair, prompts, tmp_path):
    """`--out DIR/` (trailing slash, no such folder) as `check` takes it: the folder is made and the report
    written inside under its default name, for the bench and for an A/B bench alike. Before: the A/B report
    went to `DIR.json` beside the folder (cli/ab.py took the raw path)."""
    folder = f"{tmp_path / 'a' / 'new-dir'}/"
    result = CliRunner().invoke(app, bench_args(pair, prompts, folder, "--modes", "ddtree", "--repeats", "2"))
    assert result.exit_code == 0, result.output
    assert {p.name for p in (tmp_path / "a" / "new-dir").iterdir()} == {
        f"bench-reference.{ext}" for ext in ("json", "md", "html")
    }
    ab_folder = f"{tmp_path / 'ab-dir'}/"
    ab = CliRunner().invoke(
        app, bench_args(pair, prompts, ab_folder, "--modes", "ddtree", "--against", "reference", "--max-repeats", "3")
    )
    assert ab.exit_code in (0, 1, 3), (ab.output, ab.exception)  # its A/B verdict; the timing is this machine's
    assert {p.name for p in (tmp_path / "ab-dir").iterdir()} == {
        f"ab-reference.{ext}" for ext in ("json", "md", "html")
    }
    assert json.loads((tmp_path / "ab-dir" / "ab-reference.json").read_text())["kind"] == "ab"
    assert not (tmp_path / "ab-dir.json").exists() and not (tmp_path / "a" / "new-dir.json").exists()
