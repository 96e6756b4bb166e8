#!/usr/bin/env python
"""Where a DDTree round's time goes on the GPU machine: the fast path's kernels per stage, and the
device's idle gaps, each charged to the host stage that was running while the device waited.

    python scripts/profile_round.py --shape 8b --budget 32 --out $OUT/profile-round

Issue 29 item 4 (a round at most 1.5x the plain step). ``bench_reference_stages.py`` gives each
stage's span on the device's clock and the GPU-busy share; this says *why* a span is long. One
reference engine on the shaped pair (random weights, so almost nothing is accepted: every round is
a full round), the fast path as shipped (``--path fast``: fused target layers, the tree on the host)
or ``fast-device``. After ``--warmup`` untimed calls (graphs captured), one plain call and one DDTree
call run under ``torch.profiler`` with CPU and CUDA activities; the engine's stage marks
(``DecodeClock.stage``) are wrapped in ``record_function`` ranges for the profile only (the engine
is not changed). From the trace:

* per stage: its host time, the device time of the kernels, copies and fills that ran inside it,
  and the device's idle time inside it (the stage's span minus the union of device work);
* the device's idle gaps over the decode loop, each charged to the stage (or ``between stages``)
  active on the host when the gap began;
* the top kernels by device time per round, plain and DDTree.

Writes ``OUT/profile.md``, ``OUT/profile.json`` and the Chrome traces ``OUT/{plain,ddtree}.json.gz``.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import torch

from ddtree_conformance.adapters.interface import Request, RunConfig
from ddtree_conformance.adapters.reference import clock
from ddtree_conformance.adapters.reference.clock import busy_seconds
from ddtree_conformance.adapters.reference.engine import ReferenceEngine
from ddtree_conformance.testing.shaped_pair import SHAPES, build_shaped_pair, random_prompts

PREFIX = "stage:"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="8b")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--budget", type=int, default=32)
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--new-tokens", type=int, default=24)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--path", choices=["fast", "fast-device"], default="fast")
    p.add_argument("--top", type=int, default=25, help="kernels listed per call")
    p.add_argument("--out", type=Path, required=True)
    return p.parse_args(argv)


def _staged(original):
    """``DecodeClock.stage`` that also opens a profiler range named after the stage."""

    @contextlib.contextmanager
    def stage(self, name: str):
        with torch.profiler.record_function(PREFIX + name), original(self, name):
            yield

    return stage


def _union(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[list[int]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def analyse(prof, rounds: int, top: int) -> dict:
    """Stage table, idle gaps by stage and top kernels from one profiled call (times in ms per round)."""
    events = list(prof.profiler.kineto_results.events())
    cuda = torch.autograd.DeviceType.CUDA
    device = [(e.start_ns(), e.start_ns() + e.duration_ns(), e.name()) for e in events if e.device_type() == cuda]
    stages = [
        (e.start_ns(), e.start_ns() + e.duration_ns(), e.name()[len(PREFIX) :])
        for e in events
        if e.device_type() != cuda and e.name().startswith(PREFIX)
    ]
    if not device:
        return {"error": "the profiler recorded no device work"}
    busy = _union([(a, b) for a, b, _ in device])
    loop = (busy[0][0], busy[-1][1])
    per = max(1, rounds)
    table: dict[str, dict[str, float]] = defaultdict(lambda: {"host_ms": 0.0, "device_ms": 0.0, "idle_ms": 0.0})
    for start, end, name in stages:
        row = table[name]
        row["host_ms"] += (end - start) / 1e6 / per
        inside = sum(max(0, min(b, end) - max(a, start)) for a, b in busy)
        row["device_ms"] += inside / 1e6 / per
        row["idle_ms"] += ((end - start) - inside) / 1e6 / per
    gaps: dict[str, float] = defaultdict(float)
    for (_, end_a), (start_b, _) in zip(busy, busy[1:]):
        owner = next((name for a, b, name in stages if a <= end_a < b), "between stages")
        gaps[owner] += (start_b - end_a) / 1e6 / per
    kernels: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for a, b, name in device:
        kernels[name][0] += 1
        kernels[name][1] += (b - a) / 1e6
    ranked = sorted(kernels.items(), key=lambda kv: -kv[1][1])[:top]
    span = (loop[1] - loop[0]) / 1e6
    return {
        "rounds": rounds,
        "span_ms_per_round": span / per,
        "busy_ms_per_round": busy_seconds(busy) * 1e3 / per,
        "idle_ms_per_round": (span - busy_seconds(busy) * 1e3) / per,
        "stages": dict(table),
        "idle_by_stage_ms_per_round": dict(sorted(gaps.items(), key=lambda kv: -kv[1])),
        "kernels": [
            {"name": name[:110], "calls_per_round": n / per, "ms_per_round": ms / per} for name, (n, ms) in ranked
        ],
    }


def markdown(meta: dict, results: dict) -> str:
    lines = [
        f"### Where a round goes: {meta['shape']}-shaped pair, {meta['dtype']}, B={meta['budget']}, "
        f"path {meta['path']}, {meta['device_name']}, torch {meta['torch']}",
        "",
    ]
    for mode, r in results.items():
        if "error" in r:
            lines += [f"**{mode}**: {r['error']}", ""]
            continue
        lines += [
            f"**{mode}**: {r['rounds']} rounds; per round: span {r['span_ms_per_round']:.2f} ms, device busy "
            f"{r['busy_ms_per_round']:.2f} ms, idle {r['idle_ms_per_round']:.2f} ms",
            "",
        ]
        if r["stages"]:
            lines += ["| stage | host ms | device ms inside | device idle inside |", "|---|---:|---:|---:|"]
            for name, s in r["stages"].items():
                lines.append(f"| {name} | {s['host_ms']:.3f} | {s['device_ms']:.3f} | {s['idle_ms']:.3f} |")
            lines.append("")
        lines += ["| device idle, charged to the host stage running | ms per round |", "|---|---:|"]
        lines += [f"| {name} | {ms:.3f} |" for name, ms in r["idle_by_stage_ms_per_round"].items()]
        lines += ["", "| kernel | calls per round | ms per round |", "|---|---:|---:|"]
        lines += [f"| `{k['name']}` | {k['calls_per_round']:.1f} | {k['ms_per_round']:.3f} |" for k in r["kernels"]]
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available() and args.device.startswith("cuda"):
        raise SystemExit("profile_round: --device cuda needs a CUDA device (none found)")
    args.out.mkdir(parents=True, exist_ok=True)
    clock.DecodeClock.stage = _staged(clock.DecodeClock.stage)
    target_dir, drafter_dir, target, drafter = build_shaped_pair(
        args.shape, getattr(torch, args.dtype), args.device, tempfile.mkdtemp(prefix="profile-round-")
    )
    engine = ReferenceEngine(str(target_dir), str(drafter_dir))
    engine.use_models(target, drafter, RunConfig(mode="ddtree", dtype=args.dtype, device=args.device))
    engine.fused_layers = True
    engine.device_tree = args.path == "fast-device"
    request = Request(
        prompt_ids=random_prompts(1, args.prompt_len, SHAPES[args.shape]["vocab"])[0], max_new_tokens=args.new_tokens
    )

    def config(mode: str) -> RunConfig:
        return RunConfig(
            mode=mode, budget=args.budget, dtype=args.dtype, device=args.device, timing=True, cuda_graphs=True
        )

    for _ in range(args.warmup):
        for mode in ("plain", "ddtree"):
            engine.generate([request], config(mode))
    from torch.profiler import ProfilerActivity, profile

    cuda = args.device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    results = {}
    for mode in ("plain", "ddtree"):
        sync()
        with profile(activities=activities) as prof:
            result = engine.generate([request], config(mode))[0]
            sync()
        trace = args.out / f"{mode}.json"
        prof.export_chrome_trace(str(trace))
        with open(trace, "rb") as raw, gzip.open(f"{trace}.gz", "wb") as packed:
            packed.write(raw.read())
        trace.unlink()
        results[mode] = analyse(prof, result.rounds or 0, args.top)
    meta = {
        "shape": args.shape,
        "dtype": args.dtype,
        "budget": args.budget,
        "path": args.path,
        "prompt_len": args.prompt_len,
        "new_tokens": args.new_tokens,
        "torch": torch.__version__,
        "device_name": torch.cuda.get_device_name(0) if cuda else "cpu",
        "fast_path": engine.fast_path_stats(),
    }
    (args.out / "profile.json").write_text(json.dumps({**meta, "results": results}, indent=1, default=str) + "\n")
    text = markdown(meta, results)
    (args.out / "profile.md").write_text(text)
    print(text, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
