#!/usr/bin/env python
"""The reference engine's fast path against its eager path: outputs, acceptance and graph use.

    python scripts/fast_path_equality.py --device cuda --out $OUT/equality

For each pair and dtype asked for (``--runs fixture:float32,fixture:bfloat16,8b:bfloat16``), every
mode (plain, dflash, ddtree at ``--budgets``) runs the same requests with ``cuda_graphs=False`` (the
eager oracle) and ``cuda_graphs=True`` (static caches, CUDA graphs on CUDA) in one engine, and the
table counts requests whose outputs and per-round acceptance lengths are identical. In float32 they
must all be (tests/test_gpu.py asserts it on the fixture pair); in bf16 the two paths round
differently (other attention kernels over a longer, masked key range) and a near tie may flip, which
the conformance checks score like any other bf16 difference. The graph runner's counts (captures,
replays, eager calls, a capture failure) show that the fast path really replayed graphs.
Writes ``OUT/equality.json`` and ``OUT/equality.md``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

from ddtree_conformance.adapters.interface import Request, RunConfig
from ddtree_conformance.adapters.reference.engine import ReferenceEngine


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument(
        "--runs",
        default="fixture:float32,fixture:bfloat16,8b:bfloat16",
        help="comma-separated PAIR:DTYPE (pairs: fixture, 8b, tiny)",
    )
    p.add_argument("--budgets", default="16,64,256,1024")
    p.add_argument("--prompts", type=int, default=8, help="fixture prompts (shaped pairs: 2 random prompts)")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--out", type=Path, required=True)
    return p.parse_args(argv)


def load(pair: str, dtype: str, device: str, prompts: int, scratch: Path):
    if pair == "fixture":
        from ddtree_conformance.paths import FIXTURE_DRAFTER, FIXTURE_TARGET
        from ddtree_conformance.prompts import load_prompts

        return (
            ReferenceEngine(str(FIXTURE_TARGET), str(FIXTURE_DRAFTER)),
            [p.prompt_ids for p in load_prompts("fixture")[:prompts]],
        )
    from ddtree_conformance.testing.shaped_pair import SHAPES, build_shaped_pair, random_prompts

    target_dir, drafter_dir, target, drafter = build_shaped_pair(pair, getattr(torch, dtype), device, scratch)
    engine = ReferenceEngine(str(target_dir), str(drafter_dir))
    engine.use_models(target, drafter, RunConfig(mode="ddtree", dtype=dtype, device=device))
    return engine, random_prompts(2, 128, SHAPES[pair]["vocab"])


def main(argv=None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for spec in args.runs.split(","):
        pair, dtype = spec.split(":")
        engine, prompts = load(pair, dtype, args.device, args.prompts, Path(tempfile.mkdtemp(prefix="eq-")))
        requests = [Request(prompt_ids=p, max_new_tokens=args.new_tokens) for p in prompts]
        runs = [("plain", 1), ("dflash", 1)] + [("ddtree", int(b)) for b in args.budgets.split(",")]
        for mode, budget in runs:
            out = {}
            for graphs in (False, True):
                config = RunConfig(mode=mode, budget=budget, dtype=dtype, device=args.device, cuda_graphs=graphs)
                engine.generate(requests[:1], config)  # warm-up (captures on the fast path)
                started = time.perf_counter()
                out[graphs] = (engine.generate(requests, config), time.perf_counter() - started)
            (eager, t_eager), (fast, t_fast) = out[False], out[True]
            stats = engine.fast_path_stats()
            row = {
                "pair": pair,
                "dtype": dtype,
                "mode": mode,
                "budget": budget if mode == "ddtree" else None,
                "requests": len(requests),
                "outputs_equal": sum(a.output_ids == b.output_ids for a, b in zip(eager, fast)),
                "acceptance_equal": sum(a.acceptance_lengths == b.acceptance_lengths for a, b in zip(eager, fast)),
                "eager_s": t_eager,
                "fast_s": t_fast,
                **stats,
                "settings": fast[0].engine_settings,
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
        engine.close()
        del engine
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    meta = {
        "device": torch.cuda.get_device_name(0) if args.device.startswith("cuda") else "cpu",
        "torch": torch.__version__,
        "new_tokens": args.new_tokens,
        "argv": sys.argv[1:],
    }
    (args.out / "equality.json").write_text(json.dumps({**meta, "rows": rows}, indent=1) + "\n")
    lines = [
        f"### Fast path vs eager path: {meta['device']}, torch {meta['torch']}, {args.new_tokens} new tokens",
        "",
        (
            "| pair | dtype | run | requests | outputs equal | acceptance equal | eager s | fast s | graphs "
            "captured / replays / eager calls (engine, cumulative) | capture failure |"
        ),
        "|---|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        run = r["mode"] if r["budget"] is None else f"ddtree-B{r['budget']}"
        lines.append(
            f"| {r['pair']} | {r['dtype']} | {run} | {r['requests']} | {r['outputs_equal']} | "
            f"{r['acceptance_equal']} | {r['eager_s']:.2f} | {r['fast_s']:.2f} | {r['captures']} / "
            f"{r['replays']} / {r['eager_calls']} | {r['failure'] or '-'} |"
        )
    (args.out / "equality.md").write_text("\n".join(lines) + "\n")
    print((args.out / "equality.md").read_text(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
