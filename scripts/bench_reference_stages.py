#!/usr/bin/env python
"""Round-time table: the reference engine's DDTree round, per stage, against one plain decode step.

    python scripts/bench_reference_stages.py --shape 8b --device cuda --dtype bfloat16 --paths eager,fast \
        --out $OUT/rounds

An 8B-shaped Qwen3 target and a drafter of the z-lab Qwen3-8B-DFlash-b16 shape with random weights,
built on the device (``ddtree_conformance.testing.shaped_pair``); one prompt of ``--prompt-len``
tokens (context 512 by default). For every budget B: one untimed DDTree call, then ``--repeats``
pairs of (plain, DDTree) calls in alternating order. Times are the engine's own CUDA-event times
(no host sync per round): the plain step is the plain decode span / steps, the round the DDTree
decode span / rounds, and the stages (first_draft, draft, build, compile, verify, walk, commit) their
per-round spans. The request's first draft reads the whole prompt, eagerly, once a request (a prefill of
the drafter's, where the plain step's span leaves the prefill out): the table also gives the round with it
set apart, ``(decode span - first_draft) / rounds``, the round in steady state. Random weights accept
almost nothing, which is what this measures: the cost of one round.

``--paths``: ``eager`` is transformers' eager forward on a ``DynamicCache`` (``cuda_graphs=False``),
``graphs`` transformers' layers on static caches under CUDA graphs (``fused_layers=off``, ``device_tree=off``),
``fast`` the fast path as shipped: the target's fused layers of ``lean.py``, the tree built, compiled and
walked on the host between the draft's and the verify's graphs, ``fast-device`` the same with everything
after the draft in one graph and one read back per round (``device_tree=on``; stage ``tree_round``:
build, compile, verify and walk). After the timed pairs,
one profiled
plain call and one profiled DDTree call per path give the GPU-busy share: the union of the device's
kernels, copies and fills over the decode loop's device time (``timings.stages["gpu_busy"]`` /
``["round_device"]``; the profiler slows the call a little).

One reference engine and one set of feature hooks on the target for the whole run (checked after
every budget). After each budget ``OUT/rounds.json`` and ``OUT/rounds.md`` are rewritten, so a run
cut short keeps its rows; no new budget starts past ``--total-budget-s``. The tree builder is the spec's
heap on the host, and on ``fast-device`` the tensor builder of ``adapters/reference/device_tree.py`` (equal to
the heap, ties included) inside the round's graph.

``--switch NAME=VALUE`` (repeatable) sets one of the fast path's module switches before anything is built
(:data:`SWITCHES`: the tree's Triton kernels and the beams' split threshold search, the lean forwards' row
copies and SwiGLU halves, the drafter's joint q/k norm and RoPE, the row count from which the verify runs
through cuBLASLt), so that a change can be timed on and off in alternating runs without editing the code; every
switch's value is written into ``rounds.json`` and ``rounds.md``:

    for v in on off on off; do python scripts/bench_reference_stages.py ... --switch lean.SWIGLU_HALVES=$v \
        --out $OUT/swiglu-$v-$RANDOM; done
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from ddtree_conformance.adapters.interface import Request, RunConfig
from ddtree_conformance.adapters.reference import beam_kernel, device_tree, lean
from ddtree_conformance.adapters.reference.engine import ReferenceEngine
from ddtree_conformance.cuda_wait import WAIT_MODES, wait_for_gpu
from ddtree_conformance.testing.shaped_pair import SHAPES, build_shaped_pair, random_prompts

STAGES = ("first_draft", "draft", "build", "compile", "verify", "walk", "tree_round", "commit")
# --switch names: (module, attribute, type)
SWITCHES = {
    "device_tree.ONE_LAUNCH_BEAMS": (device_tree, "ONE_LAUNCH_BEAMS", bool),
    "device_tree.TWO_LAUNCH_TOPK": (device_tree, "TWO_LAUNCH_TOPK", bool),
    "lean.ROW_COPIES_UP_TO": (lean, "ROW_COPIES_UP_TO", int),
    "lean.SWIGLU_HALVES": (lean, "SWIGLU_HALVES", bool),
    "lean.JOINT_DRAFTER_QK": (lean, "JOINT_DRAFTER_QK", bool),
    "beam_kernel.SPLIT_SEARCH": (beam_kernel, "SPLIT_SEARCH", bool),
    "device_tree.ONE_LAUNCH_TREE": (device_tree, "ONE_LAUNCH_TREE", bool),
    "lean.VERIFY_CUBLASLT_FROM_ROWS": (lean, "VERIFY_CUBLASLT_FROM_ROWS", int),
}
_TRUTH = {"on": True, "true": True, "1": True, "off": False, "false": False, "0": False}


def switch(text: str) -> tuple[str, bool | int]:
    """``NAME=VALUE`` -> ``(NAME, value)`` (argparse type: one clear error for a bad name or value)."""
    name, equals, value = text.partition("=")
    if name not in SWITCHES or not equals:
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME=VALUE with NAME one of {', '.join(SWITCHES)}")
    kind = SWITCHES[name][2]
    if kind is bool:
        if value.lower() not in _TRUTH:
            raise argparse.ArgumentTypeError(f"{name}: {value!r} is not on/off")
        return name, _TRUTH[value.lower()]
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{name}: {value!r} is not a whole number") from None
    if number < 0:
        raise argparse.ArgumentTypeError(f"{name}: {value!r} is negative")
    return name, number


def switch_values() -> dict[str, bool | int]:
    return {name: getattr(module, attribute) for name, (module, attribute, _) in SWITCHES.items()}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="8b")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--budgets", type=int, nargs="+", default=[16, 32, 64, 128, 256, 512, 1024])
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--new-tokens", type=int, default=24)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--paths", default="eager,fast", help="comma-separated: eager, graphs, fast, fast-device")
    p.add_argument("--no-busy", action="store_true", help="skip the profiled calls (GPU-busy share)")
    p.add_argument("--total-budget-s", type=float, default=300.0, help="start no budget after this much wall time")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--cuda-wait", default="auto", choices=WAIT_MODES, help="how the process waits for the GPU")
    p.add_argument(
        "--switch", type=switch, action="append", default=[], metavar="NAME=VALUE", help="a fast-path switch (doc)"
    )
    p.add_argument("--out", type=Path, required=True, help="output folder")
    return p.parse_args(argv)


def hook_count(target) -> int:
    return sum(len(layer._forward_hooks) for layer in target.model.layers)


def per_round(result) -> dict:
    stages = result.timings.stages
    rounds = max(1, result.rounds or 0)
    clock = "round_device" if "round_device" in stages else "round_wall"
    out = {k: stages[k] / rounds * 1e3 for k in STAGES if k in stages}
    out["round"] = stages[clock] / rounds * 1e3
    # the request's first draft reads the whole prompt (eager, once a request, like the prefill the plain
    # step's span leaves out): the round in steady state leaves it out too
    out["steady_round"] = (stages[clock] - stages.get("first_draft", 0.0)) / rounds * 1e3
    out["busy_share"] = stages["gpu_busy"] / stages[clock] if "gpu_busy" in stages else None
    out["tau"] = sum(result.acceptance_lengths) / rounds if result.acceptance_lengths else None
    return out


def write(out: Path, meta: dict, rows: list[dict]) -> None:
    (out / "rounds.json").write_text(json.dumps({**meta, "rows": rows}, indent=1) + "\n")
    lines = [
        f"### Round time vs plain step: {meta['shape']}-shaped Qwen3 (random weights), {meta['dtype']}, "
        f"{meta['device_name']}, context {meta['prompt_len']}",
        "",
        f"- clock: {meta['clock']}; {meta['repeats']} alternating (plain, DDTree) pairs per budget after one "
        f"untimed call; medians; {meta['new_tokens']} new tokens; torch {meta['torch']}",
        f"- feature hooks on the target: {meta['hooks']} (one per drafter feature layer, checked every budget)",
        "- fast-path switches: " + ", ".join(f"{k}={v}" for k, v in meta.get("switches", {}).items()),
        "",
        "| B | path | plain step ms | round ms | round / plain step | first draft apart: round ms | "
        "/ plain step | GPU busy: plain / round | " + " | ".join(f"{s} ms" for s in STAGES) + " | tau |",
        "|---:|---|---:|---:|---:|---:|---:|---:|" + "---:|" * len(STAGES) + "---:|",
    ]
    for r in rows:
        busy = "-" if r.get("busy_plain") is None else f"{r['busy_plain']:.0%} / {r['busy_round']:.0%}"
        lines.append(
            f"| {r['budget']} | {r['path']} | {r['plain_step_ms']:.2f} | {r['round_ms']:.2f} | "
            f"{r['round_over_step']:.2f} | {r['steady_round_ms']:.2f} | {r['steady_over_step']:.2f} | {busy} | "
            + " | ".join(f"{r['stages_ms'].get(s, float('nan')):.2f}" for s in STAGES)
            + f" | {r['tau']:.2f} |"
        )
    (out / "rounds.md").write_text("\n".join(lines) + "\n")


def main(argv=None) -> int:
    args = parse_args(argv)
    for name, value in args.switch:
        module, attribute, _ = SWITCHES[name]
        setattr(module, attribute, value)
    started = time.perf_counter()
    if args.threads:
        torch.set_num_threads(args.threads)
    wait = wait_for_gpu(args.cuda_wait, args.device)
    args.out.mkdir(parents=True, exist_ok=True)
    dtype = getattr(torch, args.dtype)
    target_dir, drafter_dir, target, drafter = build_shaped_pair(
        args.shape, dtype, args.device, tempfile.mkdtemp(prefix="rounds-")
    )
    engine = ReferenceEngine(str(target_dir), str(drafter_dir))
    engine.use_models(target, drafter, RunConfig(mode="ddtree", dtype=args.dtype, device=args.device))
    hooks = hook_count(target)
    assert hooks == len(drafter.config.target_layer_ids), hooks
    request = Request(
        prompt_ids=random_prompts(1, args.prompt_len, SHAPES[args.shape]["vocab"])[0], max_new_tokens=args.new_tokens
    )

    def run(mode: str, budget: int, path: str, profile: bool = False) -> dict:
        engine.fused_layers = path in ("fast", "fast-device")
        engine.device_tree = path == "fast-device"
        config = RunConfig(
            mode=mode,
            budget=budget,
            dtype=args.dtype,
            device=args.device,
            timing=True,
            cuda_graphs=path != "eager",
            profile=profile,
        )
        return per_round(engine.generate([request], config)[0])

    paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    for path in paths:
        run("plain", 1, path)  # warm-up
    meta = {
        "shape": args.shape,
        "dtype": args.dtype,
        "device": args.device,
        "prompt_len": args.prompt_len,
        "new_tokens": args.new_tokens,
        "repeats": args.repeats,
        "torch": torch.__version__,
        "cuda_wait": wait,
        "hooks": hooks,
        "clock": "CUDA events" if args.device.startswith("cuda") else "host perf_counter",
        "device_name": torch.cuda.get_device_name(0) if args.device.startswith("cuda") else "cpu",
        "builder": "tensors on the device, in the round's graph (fast-device); the heap on the host (others)",
        "paths": paths,
        "switches": switch_values(),
    }
    rows: list[dict] = []
    longest = 0.0
    stop = False
    for budget in args.budgets:
        for path in paths:
            elapsed = time.perf_counter() - started
            if elapsed + longest > args.total_budget_s:
                print(
                    f"total budget {args.total_budget_s:g} s: stopping before B={budget} {path} "
                    f"(elapsed {elapsed:.0f} s)"
                )
                stop = True
                break
            t0 = time.perf_counter()
            run("ddtree", budget, path)  # untimed: first call at this budget (captures its graphs)
            plains, trees = [], []
            for rep in range(args.repeats):
                order = ("plain", "ddtree") if rep % 2 == 0 else ("ddtree", "plain")
                for mode in order:
                    (plains if mode == "plain" else trees).append(run(mode, budget, path))
            if hook_count(target) != hooks:
                raise SystemExit(f"feature hooks grew from {hooks} to {hook_count(target)} at B={budget}")
            busy_plain = busy_round = None
            if not args.no_busy and args.device.startswith("cuda"):
                busy_plain = run("plain", budget, path, profile=True)["busy_share"]
                busy_round = run("ddtree", budget, path, profile=True)["busy_share"]
            ratios = [t["round"] / p["round"] for p, t in zip(plains, trees)]
            steady = [t["steady_round"] / p["round"] for p, t in zip(plains, trees)]
            row = {
                "budget": budget,
                "path": path,
                "plain_step_ms": statistics.median(p["round"] for p in plains),
                "round_ms": statistics.median(t["round"] for t in trees),
                "round_over_step": statistics.median(ratios),
                "steady_round_ms": statistics.median(t["steady_round"] for t in trees),
                "steady_over_step": statistics.median(steady),
                "busy_plain": busy_plain,
                "busy_round": busy_round,
                "stages_ms": {s: statistics.median(t[s] for t in trees) for s in STAGES if s in trees[0]},
                "tau": statistics.median(t["tau"] for t in trees),
                "samples": {"plain": plains, "ddtree": trees},
            }
            rows.append(row)
            longest = max(longest, time.perf_counter() - t0)
            print(
                f"B={budget:5} {path:5} plain {row['plain_step_ms']:7.2f} ms  round {row['round_ms']:7.2f} ms  "
                f"x{row['round_over_step']:.2f} busy {busy_plain} / {busy_round} "
                + " ".join(f"{s} {v:.2f}" for s, v in row["stages_ms"].items())
                + f"  ({time.perf_counter() - t0:.1f} s)",
                flush=True,
            )
            write(args.out, meta, rows)
        if stop:
            break
    meta["fast_path"] = engine.fast_path_stats()
    meta["elapsed_s"] = time.perf_counter() - started
    write(args.out, meta, rows)
    print((args.out / "rounds.md").read_text(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
