"""A/B throughput (``bench --against``): the candidate and a baseline build interleaved on one runner,
judged by the sequential test on their throughput ratio; ``gate`` judges an A/B report without stored
baselines.

No timed assertions: verdicts come from injected timings (engines that report their decode time) or
a simulated clock; the slow mutant's run is checked for its shape only.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import random
import zipfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ddtree_conformance.ab import baseline_for, evaluate, exit_code, measure_ab, pair_order
from ddtree_conformance.adapters.interface import Capabilities, Engine, Request, RequestResult, RunConfig, Timings
from ddtree_conformance.cli import app
from ddtree_conformance.sequential import SequentialPlan

# An engine that reports injected decode times (rounds of 20 us x SLOWDOWN, seeded noise), tau 3, no model
# work: small enough to stay under the wall clock of its own call, which the bench checks.
TIMED = """
import math
import random

from ddtree_conformance.adapters.interface import Capabilities, Engine, RequestResult, Timings

SLOWDOWN = {slowdown}


class Timed(Engine):
    name = "timed"
    OPTIONS = ("slowdown", "seed")

    def __init__(self, model_dir, drafter_dir=None, **options):
        super().__init__(model_dir, drafter_dir, **options)
        self.slowdown = float(options.get("slowdown", SLOWDOWN))
        self.rng = random.Random(options.get("seed", 0))

    def capabilities(self):
        return Capabilities(name=self.name, version=str(SLOWDOWN), modes=["plain", "dflash", "ddtree"],
                            dtypes=["float32"], devices=["cpu"], sampling=False, traces=False,
                            per_round_acceptance=True)

    def generate(self, requests, config):
        out = []
        for r in requests:
            n = r.max_new_tokens
            lengths = [1] * (n - 1) if config.mode == "plain" else [3] * math.ceil((n - 1) / 3)
            seconds = 2e-5 * self.slowdown * len(lengths) * math.exp(self.rng.gauss(0, 0.03))
            out.append(RequestResult(output_ids=[1] * n, finish_reason="length", rounds=len(lengths),
                                     acceptance_lengths=lengths,
                                     timings=Timings(decode=seconds, stages={{"round_wall": seconds}})))
        return out
"""


class Simulated(Engine):
    """Rounds of ``round_s`` x noise on a simulated clock (``now``); records its calls."""

    name = "simulated"

    def __init__(self, round_s: float, seed: int, clock: list[float], calls: list, tag: str) -> None:
        super().__init__("m", "d")
        self.round_s, self.rng, self.clock, self.calls, self.tag = round_s, random.Random(seed), clock, calls, tag

    def capabilities(self) -> Capabilities:
        return Capabilities(
            name=self.name,
            modes=["plain", "ddtree"],
            dtypes=["float32"],
            devices=["cpu"],
            sampling=False,
            traces=False,
            per_round_acceptance=True,
        )

    def generate(self, requests, config):
        out = []
        for r in requests:
            self.calls.append((self.tag, config.budget, r.prompt_ids[0]))
            lengths = [3] * math.ceil((r.max_new_tokens - 1) / 3)
            seconds = self.round_s * len(lengths) * math.exp(self.rng.gauss(0, 0.02))
            self.clock[0] += seconds + 1e-4
            out.append(
                RequestResult(
                    output_ids=[1] * r.max_new_tokens,
                    finish_reason="length",
                    rounds=len(lengths),
                    acceptance_lengths=lengths,
                    timings=Timings(stages={"round_device": seconds}),
                )
            )
        return out


REQUESTS = [Request(prompt_ids=[i + 1, 2], max_new_tokens=13) for i in range(3)]
CONFIGS = {"ddtree-B16": RunConfig(mode="ddtree", budget=16), "ddtree-B64": RunConfig(mode="ddtree", budget=64)}


def simulated_pair(candidate_round_s: float, baseline_round_s: float = 0.01):
    clock, calls = [0.0], []
    return (
        Simulated(candidate_round_s, 1, clock, calls, "candidate"),
        Simulated(baseline_round_s, 2, clock, calls, "baseline"),
        clock,
        calls,
    )


def test_pairs_are_called_back_to_back_alternating_which_goes_first():
    running = ["candidate|a", "baseline|a", "candidate|b", "baseline|b"]
    first = pair_order(running, 0, 0)
    assert first == ["candidate|a", "baseline|a", "baseline|b", "candidate|b"]
    assert pair_order(running, 0, 1) == ["baseline|a", "candidate|a", "candidate|b", "baseline|b"]
    assert pair_order(running, 1, 0)[:2] == ["baseline|b", "candidate|b"]  # the runs rotate with the repeat
    assert pair_order(["candidate|b", "baseline|b"], 3, 1) == ["candidate|b", "baseline|b"]  # a decided run drops


@pytest.mark.parametrize("candidate_round_s, decision, code", [(0.0125, "regression", 1), (0.0098, "pass", 0)])
def test_the_sequential_test_judges_the_throughput_ratio(candidate_round_s, decision, code):
    candidate, baseline, clock, calls = simulated_pair(candidate_round_s)
    part = measure_ab(
        candidate,
        baseline,
        REQUESTS,
        CONFIGS,
        tolerance=0.05,
        now=lambda: clock[0],
        plan=SequentialPlan(time_budget_s=1e6),
    )
    assert {run["ab"]["stop"]["decision"] for run in part["runs"]} == {decision}
    ratio = part["runs"][0]["ab"]["estimate"]
    assert ratio == pytest.approx(0.01 / candidate_round_s, rel=0.03)
    assert exit_code(evaluate(part)) == code
    assert part["verdict"]["status"] == ("fail" if code else "pass")
    # every request of every repeat ran on both sides, one right after the other
    tags = [tag for tag, _, _ in calls]
    assert tags.count("candidate") == tags.count("baseline")
    assert all({tags[k], tags[k + 1]} == {"candidate", "baseline"} for k in range(0, len(tags), 2))


def on_the_edge(plan: SequentialPlan | None = None) -> dict:
    """An A/B part whose candidate sits right on the 5 % edge, by default stopped after one look (three
    requests, each pair called both ways per repeat): undecided."""
    candidate, baseline, clock, _ = simulated_pair(0.01 / 0.95)
    return measure_ab(
        candidate,
        baseline,
        REQUESTS,
        {"ddtree-B16": CONFIGS["ddtree-B16"]},
        tolerance=0.05,
        now=lambda: clock[0],
        plan=plan or SequentialPlan(max_repeats=3),
    )


def test_a_ratio_inside_the_noise_is_inconclusive_when_the_budget_runs_out():
    part = on_the_edge()
    assert part["runs"][0]["ab"]["stop"]["decision"] == "inconclusive"
    assert exit_code(evaluate(part)) == 3 and part["verdict"]["status"] == "inconclusive"


def test_looks_the_time_budget_cannot_reach_are_dropped_and_the_gate_reads_the_same_plan():
    part = on_the_edge(SequentialPlan(max_repeats=60, time_budget_s=2.0))  # undecided: runs until the budget
    ab = part["runs"][0]["ab"]
    assert part["ab"]["plan"]["max_repeats_from_budget"] is True
    assert ab["max_repeats"] < 60 and ab["looks_planned"] < 8 and ab["stop"]["repeats"] <= ab["max_repeats"]
    assert ab["look_alpha"] == pytest.approx(0.05 / ab["looks_planned"])
    (row,) = evaluate(part)  # the gate's interval, recomputed from the samples at the re-planned level
    assert row.measured == f"{ab['estimate']:.3f} [{ab['ci_low']:.3f}, {ab['ci_high']:.3f}]"


def test_a_slower_candidate_still_fails_under_a_re_planned_budget():
    """Re-planning only drops looks the budget cannot reach: a candidate 20 % slower is still failed, and its
    slow repeats (a lower cap) buy it no pass."""
    candidate, baseline, clock, _ = simulated_pair(0.0125)
    part = measure_ab(
        candidate,
        baseline,
        REQUESTS,
        CONFIGS,
        tolerance=0.05,
        now=lambda: clock[0],
        plan=SequentialPlan(time_budget_s=8.0),
    )
    assert part["ab"]["plan"]["max_repeats_from_budget"] is True
    assert {run["ab"]["stop"]["decision"] for run in part["runs"]} == {"regression"}
    assert exit_code(evaluate(part)) == 1


def test_the_gate_recomputes_the_interval_from_the_samples():
    candidate, baseline, clock, _ = simulated_pair(0.0125)
    part = measure_ab(candidate, baseline, REQUESTS, CONFIGS, now=lambda: clock[0])
    forged = json.loads(json.dumps(part))
    for run in forged["runs"]:
        run["ab"].update(estimate=1.2, ci_low=1.1, ci_high=1.3, stop={"decision": "pass"})  # claims, not samples
    assert exit_code(evaluate(forged)) == 1


def test_different_clocks_cannot_be_compared():
    from ddtree_conformance.bench import BenchError

    candidate, baseline, clock, _ = simulated_pair(0.01)

    def untimed(requests, config):  # the call clock: no engine timings
        clock[0] += 0.01
        return [RequestResult(output_ids=[1] * r.max_new_tokens, finish_reason="length") for r in requests]

    baseline.generate = untimed
    with pytest.raises(BenchError, match="cannot be compared"):
        measure_ab(candidate, baseline, REQUESTS, CONFIGS, now=lambda: clock[0])


# ------------------------------------------------------------------------------------------- the CLI


def write_wheel(folder: Path, slowdown: float) -> Path:
    """A wheel of ``ddtc_ab_pkg`` 1.0 (the Timed engine at this slowdown), written by hand."""
    files = {
        "ddtc_ab_pkg/__init__.py": TIMED.format(slowdown=slowdown),
        "ddtc_ab_pkg-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: ddtc-ab-pkg\nVersion: 1.0\n",
        "ddtc_ab_pkg-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / "ddtc_ab_pkg-1.0-py3-none-any.whl"
    record = []
    with zipfile.ZipFile(wheel, "w") as zf:
        for name, text in files.items():
            data = text.encode()
            zf.writestr(name, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{name},sha256={digest},{len(data)}")
        zf.writestr("ddtc_ab_pkg-1.0.dist-info/RECORD", "\n".join([*record, "ddtc_ab_pkg-1.0.dist-info/RECORD,,"]))
    return wheel


BENCH = ["--limit", "3", "--max-new-tokens", "10", "--budgets", "16", "--modes", "ddtree"]


def bench(tmp_path, *args, code: int = 1):
    """``bench --against``: it exits with its verdict as the gate does (issue 31: it exited 0 on FAIL)."""
    out = tmp_path / "ab.json"
    result = CliRunner().invoke(app, ["bench", *BENCH, *args, "--out", str(out)])
    assert result.exit_code == code, (result.output, result.exception)
    if code == 1:
        assert "error: A/B FAIL: A/B: candidate slower than the baseline" in result.stderr, result.stderr
    gate = CliRunner().invoke(app, ["gate", str(out)])
    return json.loads(out.read_text()), gate


def test_bench_against_an_engine_here_and_the_gate_without_baselines(tmp_path, monkeypatch):
    (tmp_path / "ddtc_ab_here.py").write_text(TIMED.format(slowdown=1.0))
    monkeypatch.chdir(tmp_path)  # module:Class from the working directory
    report, gate = bench(
        tmp_path,
        "--engine",
        "ddtc_ab_here:Timed",
        "-O",
        "slowdown=1.3",
        "-O",
        "seed=1",
        "--against",
        "ddtc_ab_here:Timed",
        "--against-option",
        "seed=2",
        "--no-isolate",
        "--ab-spread",
        "0.01:4",
    )
    assert report["kind"] == "ab" and report["verdict"]["status"] == "fail"
    assert report["runs"][0]["ab"]["spread"] == {"log_var": pytest.approx(1e-4), "df": 4}
    bad = CliRunner().invoke(app, ["bench", *BENCH, "--against", "reference", "--ab-spread", "2%", "--no-isolate"])
    assert bad.exit_code == 2 and "--ab-spread must be SD:DF" in bad.output
    assert report["ab"]["against"] == "ddtc_ab_here:Timed"
    assert gate.exit_code == 1 and "A/B ratio" in gate.output and "gate REGRESSION (exit 1)" in gate.output
    assert (tmp_path / "ab.md").read_text().startswith("## FAIL: A/B: candidate slower than the baseline")
    assert "<h2>A/B throughput" in (tmp_path / "ab.html").read_text()
    (row,) = evaluate(report)  # the spread was given: the failure stands on it, and says so in its band
    assert row.status == "fail" and "no between-process spread" not in row.message, row
    assert "between-process spread 1.0 % included" in row.band, row


def test_bench_against_a_build_installed_apart(tmp_path, monkeypatch):
    """The baseline is a wheel of the same engine package (say, the merge base's build): installed into
    an overlay environment and run there, while the candidate runs from the working directory."""
    wheel = write_wheel(tmp_path / "dist", slowdown=1.0)
    (tmp_path / "ddtc_ab_pkg.py").write_text(TIMED.format(slowdown=1.3))  # the candidate: 30 % slower
    monkeypatch.chdir(tmp_path)
    report, gate = bench(
        tmp_path, "--engine", "ddtc_ab_pkg:Timed", "--against", str(wheel), "--against-option", "seed=2"
    )
    assert report["ab"]["baseline_engine"]["version"] == "1.0"  # the installed build, not the working directory's
    # judged without a between-process spread: the failure says so, and how to measure one
    (row,) = evaluate(report)
    assert row.status == "fail" and "no between-process spread in the interval" in row.message, row
    assert "--ab-spread" in row.message
    assert report["engine"]["version"] == "1.3"
    assert "installed from" in report["ab"]["baseline"]
    assert gate.exit_code == 1, gate.output


def test_against_names_something_usable(tmp_path):
    from ddtree_conformance.ab import AgainstError

    with pytest.raises(AgainstError, match="a file must be a wheel"):
        (tmp_path / "notes.txt").write_text("")
        baseline_for(str(tmp_path / "notes.txt"), "reference", tmp_path)
    with pytest.raises(AgainstError, match="not a requirement"):
        baseline_for("my engine ==", "reference", tmp_path)
    assert baseline_for("reference", "my_pkg:Mine", tmp_path).installed is False


def test_a_slow_mutant_against_the_reference(random_pair, tmp_path):
    """The slow mutant (every tree verify twice as long) against the reference on the random pair, on
    real timings: the report's shape, not its verdict (no timed assertions)."""
    target, drafter = random_pair
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(
        "".join(json.dumps({"id": f"p{i}", "category": "math", "prompt_ids": [1 + i, 2, 3]}) + "\n" for i in range(2))
    )
    out = tmp_path / "ab.json"
    result = CliRunner().invoke(
        app,
        [
            str(a)
            for a in (
                "bench",
                "--engine",
                "ddtree_conformance.testing.slow_engines:SlowVerify",
                "-O",
                "verify_slowdown=1.0",
                "--against",
                "reference",
                "--model",
                target,
                "--drafter",
                drafter,
                "--prompts",
                prompts,
                "--modes",
                "ddtree",
                "--budgets",
                "8",
                "--max-new-tokens",
                "12",
                "--no-isolate",
                "--max-repeats",
                "3",
                "--time-budget",
                "60",
                "--out",
                out,
            )
        ],
    )
    assert result.exit_code in (0, 1, 3), (result.output, result.exception)  # its verdict's, on real timings
    report = json.loads(out.read_text())
    assert result.exit_code == {"pass": 0, "fail": 1, "inconclusive": 3}[report["verdict"]["status"]]
    (run,) = report["runs"]
    assert len(run["ab"]["samples"]) == 3 and all(x > 0 for x in run["ab"]["samples"])
    assert run["tau"] == run["baseline_tau"]  # the mutant accepts exactly what the reference does
    assert run["ab"]["stop"]["decision"] in ("pass", "regression", "inconclusive")
    assert report["ab"]["candidate"].startswith("slow-verify") and report["ab"]["baseline"].startswith("reference")


def test_an_undecided_ab_row_names_the_noisy_machine_and_what_would_decide_it():
    """Issue 29's stressed H200 trials: with 16 busy processes beside it, an A/B interval of a 5 % slower
    build came out too wide to decide, and the message did not say why. It names the busy host (the run's
    own state: A/B has no baseline state to compare with) and about how many repeats would decide it."""
    from ddtree_conformance.machine_state import summarise

    part = on_the_edge()

    def states(others: float, throttle=(), clocks=(1980.0,)) -> dict:
        return summarise(
            [
                {
                    "gpu": {
                        "sm_clock_mhz": c,
                        "mem_clock_mhz": 3201.0,
                        "power_w": 400.0,
                        "temperature_c": 50.0,
                        "throttle": list(throttle),
                    },
                    "host": {"cores": 16, "cpu_percent": min(100.0, others + 6), "others_cpu_percent": others},
                }
                for c in clocks
            ]
        )

    part["ab"]["machine"] = states(others=2)
    (quiet,) = evaluate(part)
    assert quiet.status == "inconclusive" and "likely cause" not in quiet.message
    assert "repeats" in quiet.message  # what would decide it, even on a quiet machine
    for state, cause in (
        (states(others=94), "other processes kept 94 % of the host CPU busy"),
        (states(others=2, throttle=["sw_power_cap"]), "GPU throttled (sw_power_cap)"),
        (states(others=2, clocks=(1980.0, 1755.0)), "SM clock moved 1755-1980 MHz"),
    ):
        part["ab"]["machine"] = state
        (row,) = evaluate(part)
        assert row.status == "inconclusive" and f"likely cause of the noise: {cause}" in row.message, row.message
    # a decided row keeps its verdict and says nothing of noise: the interleaving cancels a slower machine
    candidate, baseline, clock, _ = simulated_pair(0.0125)
    slow = measure_ab(candidate, baseline, REQUESTS, {"ddtree-B16": CONFIGS["ddtree-B16"]}, now=lambda: clock[0])
    slow["ab"]["machine"] = states(others=94)
    (row,) = evaluate(slow)
    assert row.status == "fail" and "likely cause" not in row.message


class AfterPause(Simulated):
    """:class:`Simulated` on a machine whose first call after a pause of a second or more runs 25 % slow
    (what issue 29's H200 trials showed with the host's cores busy), whichever engine makes it."""

    def __init__(self, *args, machine: dict, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.machine = machine

    def generate(self, requests, config):
        paused = self.clock[0] - self.machine["idle_from"] >= 1.0
        round_s, self.round_s = self.round_s, self.round_s * (1.25 if paused else 1.0)
        try:
            return super().generate(requests, config)
        finally:
            self.round_s, self.machine["idle_from"] = round_s, self.clock[0]


def test_the_first_call_after_a_pause_is_not_timed_against_the_candidate():
    """Repeat 0 calls the candidate first. With no warm-up (``--no-warmup``, or trials on a warmed-up
    machine), a pause before the measurement made that first call slow and the first ratio the run's
    smallest (issue 29). The call right before the timed repeats is untimed, so A/A's first ratio is
    unbiased; unprimed, the same run shows the bias."""

    def first_ratio(prime: bool) -> float:
        clock, calls, machine = [0.0], [], {"idle_from": 0.0}
        candidate = AfterPause(0.01, 1, clock, calls, "candidate", machine=machine)
        baseline = AfterPause(0.01, 2, clock, calls, "baseline", machine=machine)
        clock[0] += 5.0  # the pause: the previous trial's end, a neighbour's job starting
        part = measure_ab(
            candidate,
            baseline,
            REQUESTS[:1],
            {"ddtree-B16": CONFIGS["ddtree-B16"]},
            warmup=False,
            prime=prime,
            now=lambda: clock[0],
            plan=SequentialPlan(max_repeats=3),
        )
        assert part["ab"]["warmup"].get("primed", False) is prime
        return part["runs"][0]["ab"]["samples"][0]

    assert first_ratio(prime=True) == pytest.approx(1.0, abs=0.08)
    assert first_ratio(prime=False) < 0.92  # the bias the priming call removes
