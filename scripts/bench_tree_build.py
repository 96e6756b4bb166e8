#!/usr/bin/env python
"""Benchmark DDTree construction (the heap builder), CPU and (if present) CUDA.

Times ``build_tree`` from ``ddtree_conformance.spec.tree`` on random drafter logits of shape
``[L, V]`` (default L=15, V=151,936: Qwen3 with a b16 drafter) for each budget B. Each timing is the
median of ``--repeats`` runs after ``--warmup`` untimed runs; on CUDA the device is synchronised
before and after every run, so the time includes the top-k on the device, the copy to the host and
the heap. Prints a table and, with ``--out``, writes the numbers as JSON. (The tensor-only builder
this used to compare against was removed; see ``conformance/spec/tree.py``.)

    python scripts/bench_tree_build.py --repeats 5 --out bench.json
    python scripts/bench_tree_build.py --devices cuda --budgets 256 1024
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from ddtree_conformance.spec.tree import build_tree

BUILDERS = {"heap": build_tree}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_builder(builder, logits: torch.Tensor, budget: int, warmup: int, repeats: int) -> dict:
    device = logits.device
    for _ in range(warmup):
        builder(logits, budget)
    _sync(device)
    samples = []
    nodes = None
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        tree = builder(logits, budget)
        _sync(device)
        samples.append(time.perf_counter() - t0)
        nodes = tree.num_nodes
    return {
        "median_ms": statistics.median(samples) * 1e3,
        "min_ms": min(samples) * 1e3,
        "max_ms": max(samples) * 1e3,
        "repeats": repeats,
        "nodes": nodes,
    }


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--depth", type=int, default=15, help="L: drafted positions per round (block size - 1)")
    parser.add_argument("--vocab", type=int, default=151_936, help="V: vocabulary size")
    parser.add_argument("--budgets", type=int, nargs="+", default=[16, 64, 256, 1024])
    parser.add_argument("--repeats", type=int, default=20, help="timed runs per cell (median reported)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument(
        "--devices", nargs="+", default=None, help="devices to run on (default: cpu, plus cuda when available)"
    )
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"], help="logits dtype")
    parser.add_argument("--scale", type=float, default=3.0, help="logits ~ N(0, scale^2)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--out", type=Path, default=None, help="write results as JSON here")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    devices = args.devices or (["cpu"] + (["cuda"] if torch.cuda.is_available() else []))
    dtype = getattr(torch, args.dtype)
    gen = torch.Generator().manual_seed(args.seed)
    base = (torch.randn(args.depth, args.vocab, generator=gen) * args.scale).to(dtype)

    rows = []
    for device_name in devices:
        device = torch.device(device_name)
        if device.type == "cuda" and not torch.cuda.is_available():
            print(f"skipping {device_name}: CUDA not available", file=sys.stderr)
            continue
        logits = base.to(device)
        for budget in args.budgets:
            for name, builder in BUILDERS.items():
                stats = time_builder(builder, logits, budget, args.warmup, args.repeats)
                rows.append({"device": device_name, "builder": name, "budget": budget, **stats})

    env = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "processor": platform.processor() or platform.machine(),
        "cpu_threads": torch.get_num_threads(),
        "cuda_device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}

    header = f"{'device':<8} {'builder':<11} {'B':>6} {'nodes':>6} {'median ms':>10} {'min ms':>9} {'max ms':>9}"
    print(f"DDTree build, L={args.depth}, V={args.vocab}, logits {args.dtype}, torch {torch.__version__}")
    print(header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{r['device']:<8} {r['builder']:<11} {r['budget']:>6} {r['nodes']:>6} "
            f"{r['median_ms']:>10.3f} {r['min_ms']:>9.3f} {r['max_ms']:>9.3f}"
        )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"config": config, "environment": env, "results": rows}, indent=2) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
