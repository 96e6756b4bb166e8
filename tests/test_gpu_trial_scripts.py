"""The GPU trial scripts run end to end on CPU with a tiny shape, so their first GPU run is not their first run.

Only structure is checked (files written, one row per engine and budget): their numbers are for the
GPU, where the lead runs them (docs/reference/bench-and-gates.md gives the commands).
"""

from __future__ import annotations

import json
import runpy
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


def module(name: str) -> dict:
    return runpy.run_path(str(SCRIPTS / name), run_name="script_under_test")


def script(name: str):
    return module(name)["main"]


@pytest.mark.slow
def test_gate_decisiveness_writes_its_table(tmp_path, monkeypatch):
    """Both gates, A/A included, a stress job beside every second trial; a second call on the same state adds
    its rows to the first's (trials spread over calls on one machine), and --summarise reads them back. Every
    engine runs the same path, the host's, even where the reference's default would take the round as one
    graph (here the GPU check is stood in for): the mutants slow a host stage, so the comparison must be
    like for like."""
    from ddtree_conformance.adapters.reference import beam_kernel, device_tree
    from ddtree_conformance.adapters.reference.engine import ReferenceEngine

    monkeypatch.setattr(device_tree, "_on_a_gpu", lambda device: True)
    monkeypatch.setattr(device_tree, "_launch", lambda *args: None)  # the kernels "fail": tensors serve
    monkeypatch.setattr(beam_kernel, "kernel_available", lambda device, budget, k: True)
    monkeypatch.setattr(ReferenceEngine, "fast_path_on", lambda self, config: config.tensor_parallel_size == 1)
    on_device, decide = [], ReferenceEngine._round_on_device
    monkeypatch.setattr(
        ReferenceEngine, "_round_on_device", lambda self, *a: on_device.append(decide(self, *a)) or on_device[-1]
    )
    main = script("gate_decisiveness.py")
    out, state = tmp_path / "decisive", tmp_path / "state"
    args = [
        "--pair",
        "tiny",
        "--device",
        "cpu",
        "--dtype",
        "float32",
        "--trials",
        "1",
        "--engines",
        "correct,build+2ms",
    ]
    args += ["--prompts", "1", "--prompt-len", "8", "--new-tokens", "6", "--budget", "4", "--baseline-repeats", "3"]
    args += ["--max-repeats", "4", "--threads", "1", "--stress", "1", "--stress-settle-s", "0.2", "--warmup-s", "5"]
    args += ["--state", str(state)]  # the load settles 0.2 s, not 5 s: four stressed trials, 19 s less of sleep
    assert main([*args, "--out", str(out)]) == 0
    assert on_device and not any(on_device)  # every engine, the correct one included, on the host path
    rows = [json.loads(line) for line in (out / "trials.jsonl").read_text().splitlines()]
    assert sorted((r["label"], r["gate"]) for r in rows) == [
        ("A/A", "ab"),
        ("build+2ms", "ab"),
        ("build+2ms", "stored"),
        ("correct", "stored"),
    ]
    assert [r["stress"] for r in rows] == [0, 1, 0, 1] and [r["stress_settle_s"] for r in rows] == [0, 0.2, 0, 0.2]
    assert all(r["machine"]["boot_id"] and r["repeats"] >= 2 and r["gpu_s"] > 0 for r in rows)
    assert all(r["state"]["gpu"] == "not sampled: device cpu has no GPU" for r in rows)
    assert json.loads((out / "baselines.json").read_text())["entries"][0]["speedup"]["runs"][0]["estimate"] > 0
    assert main([*args, "--out", str(tmp_path / "second")]) == 0  # the same machine, a later call
    assert len((state / "trials.jsonl").read_text().splitlines()) == 8
    table = json.loads((tmp_path / "second" / "table.json").read_text())
    assert {(b["engine"], b["gate"], b["trials"]) for b in table["engines"]} == {
        ("correct", "ab", 2),
        ("correct", "stored", 2),
        ("build+2ms", "ab", 2),
        ("build+2ms", "stored", 2),
    }
    assert main(["--summarise", str(state / "trials.jsonl"), "--out", str(tmp_path / "all")]) == 0
    assert "| correct (A/A) | ab | pass | 2 |" in (tmp_path / "all" / "table.md").read_text()


@pytest.mark.slow
def test_round_time_table_writes_its_rows(tmp_path, monkeypatch):
    from ddtree_conformance.adapters.reference import lean

    main = script("bench_reference_stages.py")
    out = tmp_path / "rounds"
    monkeypatch.setattr(lean, "SWIGLU_HALVES", lean.SWIGLU_HALVES)  # restored after: --switch sets it for the run
    monkeypatch.setattr(lean, "ROW_COPIES_UP_TO", lean.ROW_COPIES_UP_TO)
    assert (
        main(
            [
                "--shape",
                "tiny",
                "--device",
                "cpu",
                "--dtype",
                "float32",
                "--budgets",
                "4",
                "16",
                "--prompt-len",
                "8",
                "--new-tokens",
                "5",
                "--repeats",
                "1",
                "--threads",
                "1",
                "--paths",
                "eager,fast,fast-device",
                "--switch",
                "lean.SWIGLU_HALVES=on",
                "--switch",
                "lean.ROW_COPIES_UP_TO=0",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    table = json.loads((out / "rounds.json").read_text())
    assert table["switches"]["lean.SWIGLU_HALVES"] is True and table["switches"]["lean.ROW_COPIES_UP_TO"] == 0
    assert table["switches"]["device_tree.TWO_LAUNCH_TOPK"] is True  # every switch is written, set or not
    assert "lean.SWIGLU_HALVES=True" in (out / "rounds.md").read_text()
    rows = table["rows"]
    paths = ["eager", "fast", "fast-device"]
    assert [(r["budget"], r["path"]) for r in rows] == [(b, p) for b in (4, 16) for p in paths]
    # fast-device verifies inside the round's one graph (stage tree_round), the others on their own
    assert all(r["plain_step_ms"] > 0 and r["round_ms"] > 0 for r in rows)
    assert [("verify" in r["stages_ms"], "tree_round" in r["stages_ms"]) for r in rows] == [
        (True, False),
        (True, False),
        (False, True),
    ] * 2
    assert "| 16 | fast |" in (out / "rounds.md").read_text()
    # every path's request drafts once over the prompt; the steady round sets that draft apart
    for r in rows:
        first = r["stages_ms"]["first_draft"]
        assert first > 0 and abs(r["steady_round_ms"] - (r["round_ms"] - first)) < 0.05 * r["round_ms"], r
    assert all("draft" not in r["stages_ms"] for r in rows if r["path"] == "fast-device")  # drafts in the graph


@pytest.mark.slow
def test_fast_path_equality_writes_its_table(tmp_path):
    main = script("fast_path_equality.py")
    out = tmp_path / "equality"
    assert (
        main(["--device", "cpu", "--runs", "tiny:float32", "--budgets", "4", "--new-tokens", "5", "--out", str(out)])
        == 0
    )
    rows = json.loads((out / "equality.json").read_text())["rows"]
    assert [r["mode"] for r in rows] == ["plain", "dflash", "ddtree"]
    assert all(r["outputs_equal"] == r["requests"] == r["acceptance_equal"] for r in rows)


@pytest.mark.parametrize(
    "bad, says",
    [
        ("lean.NOPE=1", "expected NAME=VALUE with NAME one of"),
        ("lean.SWIGLU_HALVES", "expected NAME=VALUE"),
        ("lean.SWIGLU_HALVES=maybe", "'maybe' is not on/off"),
        ("lean.ROW_COPIES_UP_TO=many", "'many' is not a whole number"),
        ("lean.ROW_COPIES_UP_TO=-1", "is negative"),
    ],
)
def test_the_round_time_tables_switches_refuse_bad_values_with_one_error(bad, says, capsys):
    main = script("bench_reference_stages.py")
    with pytest.raises(SystemExit) as stop:
        main(["--out", "unused", "--switch", bad])
    assert stop.value.code == 2 and says in capsys.readouterr().err


def test_the_element_wise_bench_checks_its_equalities_on_cpu(capsys):
    """``--device cpu``: no timing, every way computed once; the row copies and the SwiGLU halves must equal the
    way they replace bit for bit (lean.py's claim), the weight in the norm must not."""
    main = script("bench_elementwise.py")
    shape = ["--hidden", "64", "--inter", "96", "--heads", "4", "--kv-heads", "2", "--head-dim", "16"]
    assert main(["--device", "cpu", "--rows", "1", "5", "--calls", "1", *shape]) == 0
    rows = [line.split("|")[1:-1] for line in capsys.readouterr().out.splitlines() if line.startswith("| ")][1:]
    differing = {(piece.strip(), int(r), way.strip()): float(share) for piece, r, way, _, share in rows}
    assert len(differing) == 2 * 12  # six pieces, twelve ways, two row counts
    for (piece, rows_, way), share in differing.items():
        if way in ("row copies", "halves of [2, T, I]"):
            assert share == 0.0, (piece, rows_, way)
    assert differing[("RMSNorm [T, H]", 5, "weight in the norm")] > 0


def test_the_skinny_gemm_bench_pads_slices_and_tables_every_weight_and_row_count(capsys):
    """``--device cpu``: untimed, one row per weight and row count, a column per way; padded products give back
    the real rows only (the padding's zero rows sliced off), and a bad row count is one clear error."""
    import torch

    bench = module("bench_skinny_gemm.py")
    x = torch.ones(5, 3)
    assert bench["padded"](x, 4).shape == (8, 3) and bench["padded"](x, 4)[5:].abs().sum() == 0
    assert bench["padded"](x, 5) is x
    copies = [torch.randn(7, 3), torch.randn(7, 3)]
    got = bench["run_way"](x, copies, 3, 4)
    assert [tuple(g.shape) for g in got] == [(5, 7)] * 3 and torch.equal(got[1], x @ copies[1].T)
    shape = ["--shape", "tiny"]
    tiny = bench["parse_args"](["--device", "cpu", *shape])  # the shaped pair's own dimensions, not restated
    assert bench["weights"](tiny) == {"qkv": (128, 64), "o": (64, 64), "gate_up": (256, 64), "down": (64, 128)}
    assert bench["main"](["--device", "cpu", "--rows", "1", "9", "--pads", "8", *shape]) == 0
    rows = [line.split("|")[1:-1] for line in capsys.readouterr().out.splitlines() if line.startswith("| ")][1:]
    assert [(r[0].strip(), int(r[1])) for r in rows] == [
        (w, n) for w in ("qkv", "o", "gate_up", "down", "lm_head") for n in (1, 9)
    ]
    assert all(len(r) == 4 for r in rows)  # weight, rows, linear, padded to 8 (no cuBLASLt on a CPU)
    with pytest.raises(SystemExit) as stop:
        bench["main"](["--device", "cpu", "--rows", "0"])
    assert stop.value.code == 2 and "--rows and --pads take positive integers" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:
        bench["main"](["--device", "cpu", "--shape", "70b"])
    assert stop.value.code == 2 and "--shape: invalid choice: '70b'" in capsys.readouterr().err
    assert bench["main"](["--device", "cpu", "--rows", "3", "--pads", "8", *shape, "--no-lm-head"]) == 0
    assert "lm_head" not in capsys.readouterr().out  # the four layer products only
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit) as stop:
            bench["main"]([])  # the default device, cuda, on a machine without one
        assert stop.value.code == 2 and "no CUDA device here" in capsys.readouterr().err


def test_the_round_parts_profile_charges_each_kernel_to_the_parts_open_at_its_launch():
    parts = module("profile_round_parts.py")
    ranges = [(100, 900, "round"), (120, 400, "verified round"), (130, 200, "tree"), (500, 800, "commit and draft")]
    ranges.append((600, 700, "lm_head"))
    launches = {1: 50, 2: 135, 3: 250, 4: 650, 5: 750, 6: 850}
    kernels = [(1, 1_000_000, "a"), (2, 2_000_000, "b"), (3, 500_000, "a"), (4, 3_000_000, "gemm")]
    kernels += [
        (5, 1_000_000, "a"),
        (6, 1_000_000, "a"),
        (7, 3_000_000, "c"),
        (4, 1_000_000, "gemm"),
    ]  # 7: no runtime call
    table = parts["attribute"](kernels, launches, ranges, rounds=2)
    assert table["round > commit and draft > lm_head"]["top"] == [
        {"kernel": "gemm", "calls_per_round": 1.0, "ms_per_round": 2.0}
    ]
    assert [k["kernel"] for k in table["round > verified round"]["top"]] == ["a"]
    assert {path: {k: v for k, v in row.items() if k != "top"} for path, row in table.items()} == {
        "outside the round": {"kernels_per_round": 0.5, "device_ms_per_round": 0.5},
        "round > verified round > tree": {"kernels_per_round": 0.5, "device_ms_per_round": 1.0},
        "round > verified round": {"kernels_per_round": 0.5, "device_ms_per_round": 0.25},
        "round > commit and draft > lm_head": {"kernels_per_round": 1.0, "device_ms_per_round": 2.0},
        "round > commit and draft": {"kernels_per_round": 0.5, "device_ms_per_round": 0.5},
        "round": {"kernels_per_round": 0.5, "device_ms_per_round": 0.5},
        "(unmatched launch)": {"kernels_per_round": 0.5, "device_ms_per_round": 1.5},
    }
    text = parts["markdown"](
        {"shape": "8b", "dtype": "bfloat16", "budget": 64, "device_name": "X", "torch": "t", "rounds": 2}, table
    )
    assert "**4.250 ms per round**" in text and "| round > commit and draft > lm_head | 1.0 | 2.000 | 47.1% |" in text
    assert "| round > commit and draft > lm_head | `gemm` | 1.0 | 2.000 |" in text
    assert "outside the round | `" not in text  # kernels are listed for the round's parts only


def test_the_round_parts_profile_marks_the_parts_and_restores_everything():
    import torch

    from ddtree_conformance.adapters.reference import decoders, graphs

    parts = module("profile_round_parts.py")
    before = (decoders.build_tree_with_ancestors, graphs.GraphRunner._capture, torch.nn.Linear.forward)
    vocabulary, small = torch.nn.Linear(4, 40_000), torch.nn.Linear(4, 8)
    x = torch.randn(2, 4)
    with parts["parts_marked"](40_000):
        assert decoders.build_tree_with_ancestors is not before[0]
        with torch.profiler.profile() as prof:
            assert torch.equal(vocabulary(x), torch.nn.functional.linear(x, vocabulary.weight, vocabulary.bias))
            small(x)
    names = [e.name for e in prof.events()]
    assert names.count("part:lm_head") == 1
    assert (decoders.build_tree_with_ancestors, graphs.GraphRunner._capture, torch.nn.Linear.forward) == before


def _gpu_trials(tmp_path, *jobs, **env):
    import os
    import subprocess

    environ = {k: v for k, v in os.environ.items() if not k.startswith("ROUND_")}
    environ |= {"OUT": str(tmp_path / "out"), **env}
    root = SCRIPTS.parent
    return subprocess.run(
        ["bash", str(SCRIPTS / "gpu_trials.sh"), *jobs], cwd=root, env=environ, capture_output=True, text=True
    )


CELL = "attention in FlashAttention's order|rounding|float32|1"


@pytest.mark.parametrize(
    ("env", "jobs", "message"),
    [
        ({}, ["rounding-cells"], "ROUND_CELLS must hold"),
        (
            {"ROUND_CELLS": CELL + ";x|rounding|float64|2"},
            ["rounding-cells"],
            "ROUND_CELLS: 'x|rounding|float64|2' is not",
        ),
        ({"ROUND_CELLS": "x|traced|float32|1"}, ["rounding-cells"], "ROUND_CELLS: 'x|traced|float32|1' is not"),
        ({"ROUND_CELLS": CELL, "ROUND_JOBS": "1.5"}, ["rounding-cells"], "ROUND_JOBS: '1.5' is not a whole number"),
        ({"ROUND_CELLS": CELL, "ROUND_TIMEOUT": "9m"}, ["rounding-cells"], "ROUND_TIMEOUT: '9m' is not a whole number"),
        ({}, ["rounds", "round-part"], "gpu_trials: unknown job 'round-part' (one of: "),
    ],
)
def test_gpu_trials_refuses_bad_settings_before_its_setup(tmp_path, env, jobs, message):
    """A device call spends its minutes on the setup first: a misspelt job or a malformed cell, job count or timeout
    is one error naming the variable (exit 2) before anything is installed, linked or started."""
    out = _gpu_trials(tmp_path, *jobs, **env)
    assert out.returncode == 2 and message in out.stderr, out.stderr
    assert out.stdout == "" and not (tmp_path / "out").exists()


def test_gpu_trials_check_only_passes_good_settings_and_knows_every_job(tmp_path):
    """``check-only`` stops after the checks (exit 0) on settings the jobs accept; the list the names are checked
    against is the script's own jobs, no more and no fewer."""
    import re

    out = _gpu_trials(tmp_path, "rounding-cells", "rounds", "check-only", ROUND_CELLS=f"{CELL};{CELL[:-1]}2")
    assert out.returncode == 0 and "settings check out" in out.stdout, out.stderr
    text = (SCRIPTS / "gpu_trials.sh").read_text()
    listed = set(re.search(r'^JOBS="([^"]*)"', text, re.M).group(1).split())
    cases = {name for label in re.findall(r"^    ([a-z0-9|-]+)\)", text, re.M) for name in label.split("|")}
    assert listed == cases | {"check-only"}
