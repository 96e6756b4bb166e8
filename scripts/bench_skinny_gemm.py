#!/usr/bin/env python3
"""Issue 29, item 4: the target's matrix products at a plain step's one row and a verify's B + 1 rows, each way
timed inside a CUDA graph.

The round by part (scripts/profile_round_parts.py, H100 4c817fff, 2026-12-06) found the target's forward 0.69 ms
longer over 65 rows than over 17, most of it in the GEMMs (5.33 -> 5.62 ms a forward): cuBLAS takes other tiles for
65 rows than for 17, and one of a layer's products moves to another kernel. The GEMMs are bound by reading the
weights, so in principle 65 rows cost what 17 do. This bench asks which row counts cuBLAS serves well, and whether
a verify batch padded to one of them (rows of zeros, sliced off after) or another BLAS back end would serve 65
rows as fast as 17. The ways, per weight and row count:

* ``linear``: ``F.linear(x, w)`` as the lean forward calls it;
* ``padded to P``: the rows padded with zeros to a multiple of P, then ``F.linear`` and the real rows sliced off;
* ``cublaslt``: ``F.linear`` with ``torch.backends.cuda.preferred_blas_library("cublaslt")`` (CUDA only).

Every call reads another copy of the weight (``--copies``, so that the copies together exceed the L2 cache, as a
forward's 36 layers do). Per weight, rows and way: microseconds per call (the median of five timings of a graph
holding ``--calls`` calls, replayed ``--replays`` times), the weight's bytes read per second, and whether the real
rows equal ``linear``'s bit for bit (padding may move a product to a kernel that sums in another order). The
target's lm_head (``--no-lm-head`` leaves it out) is timed the same way: the verify runs it over the tree's rows,
the plain step over one. Then one forward's GEMMs (the layers' four products, and the lm_head once) at each row
count and way. The dimensions are the shaped pair's (``--shape``: ``SHAPES`` of
``ddtree_conformance.testing.shaped_pair``, the 8B shape by default). A measurement, not a test; it needs a
CUDA device (``--device cpu`` checks only the equalities, untimed).

    python scripts/bench_skinny_gemm.py [--rows 1 17 33 65 72 80 96 128] [--pads 16 32 64] [--shape 8b]
                                        [--no-lm-head]
"""

from __future__ import annotations

import argparse
import functools
import math

import torch
import torch.nn.functional as F

from ddtree_conformance.adapters.reference.clock import graph_replay_us
from ddtree_conformance.adapters.reference.lean import blas_library
from ddtree_conformance.testing.shaped_pair import SHAPES

L2_BYTES = 64 << 20  # more than an H100's (50 MiB) or H200's L2: the copies together always exceed it


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, nargs="+", default=[1, 17, 33, 65, 72, 80, 96, 128])
    p.add_argument("--pads", type=int, nargs="*", default=[16, 32, 64], help="pad the rows to a multiple of each")
    p.add_argument("--shape", choices=sorted(SHAPES), default="8b", help="the shaped pair's target dimensions")
    p.add_argument("--lm-head", action=argparse.BooleanOptionalAction, default=True, help="time the lm_head too")
    p.add_argument("--calls", type=int, default=24, help="calls per graph")
    p.add_argument("--replays", type=int, default=20)
    p.add_argument("--dtype", choices=["bfloat16", "float16"], default="bfloat16")
    p.add_argument("--device", default="cuda")
    args = p.parse_args(argv)
    bad = [n for n in (*args.rows, *args.pads) if n < 1]
    if bad:
        p.error(f"--rows and --pads take positive integers, got {bad}")
    if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
        p.error(f"--device {args.device}: no CUDA device here (--device cpu checks the equalities, untimed)")
    return args


def weights(args) -> dict[str, tuple[int, int]]:
    """(out features, in features) of a layer's four products, as the lean forward fuses them."""
    s = SHAPES[args.shape]
    q, kv = s["heads"] * s["head_dim"], s["kv"] * s["head_dim"]
    return {
        "qkv": (q + 2 * kv, s["hidden"]),
        "o": (s["hidden"], q),
        "gate_up": (2 * s["inter"], s["hidden"]),
        "down": (s["hidden"], s["inter"]),
    }


def padded(x: torch.Tensor, multiple: int) -> torch.Tensor:
    rows = -(-x.shape[0] // multiple) * multiple  # rounded up to a multiple
    return F.pad(x, (0, 0, 0, rows - x.shape[0])) if rows > x.shape[0] else x


def ways(pads: list[int], cuda: bool) -> dict[str, tuple[int | None, str | None]]:
    """way -> (pad multiple or None, BLAS library or None); the BLAS back end only on CUDA."""
    out = {"linear": (None, None)}
    out.update({f"padded to {p}": (p, None) for p in pads})
    if cuda:
        out["cublaslt"] = (None, "cublaslt")
    return out


def run_way(xs: torch.Tensor, copies: list[torch.Tensor], calls: int, pad: int | None) -> list[torch.Tensor]:
    """``calls`` products, each against the next copy of the weight; the real rows of each."""
    rows = xs.shape[0]
    x = xs if pad is None else padded(xs, pad)
    return [F.linear(x, copies[i % len(copies)])[:rows] for i in range(calls)]


def main(argv=None) -> int:
    args = parse_args(argv)
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    timed = device.type == "cuda"
    generator = torch.Generator().manual_seed(0)
    table_ways = ways(args.pads, timed)
    results: dict[tuple[str, int, str], float] = {}
    head = ["weight", "rows", *(f"{w} us (GB/s, same)" for w in table_ways)]
    lines = [f"| {' | '.join(head)} |", "|" + "---|" * len(head)]
    shape = SHAPES[args.shape]
    products = {**weights(args), **({"lm_head": (shape["vocab"], shape["hidden"])} if args.lm_head else {})}
    for name, (out_features, in_features) in products.items():
        size = out_features * in_features * torch.finfo(dtype).bits // 8
        count = max(2, math.ceil(L2_BYTES / size) + 1) if timed else 1
        copies = [
            (torch.randn(out_features, in_features, generator=generator) * in_features**-0.5).to(dtype).to(device)
            for _ in range(count)
        ]
        for rows in args.rows:
            xs = torch.randn(rows, in_features, generator=generator).to(dtype).to(device)
            want = F.linear(xs, copies[0])
            cells = []
            for way, (pad, library) in table_ways.items():
                with blas_library(library, device):
                    got = run_way(xs, copies, 1, pad)[0]
                    same = torch.equal(got, want)
                    if timed:
                        work = functools.partial(run_way, xs, copies, args.calls, pad)
                        us, _ = graph_replay_us(work, args.replays)
                        us /= args.calls
                        results[(name, rows, way)] = us
                        cells.append(f"{us:.1f} ({size / us / 1e3:.0f}, {'yes' if same else 'no'})")
                    else:
                        cells.append(f"- (-, {'yes' if same else 'no'})")
            lines.append(f"| {name} | {rows} | {' | '.join(cells)} |")
        del copies
        if timed:
            torch.cuda.empty_cache()
    where = torch.cuda.get_device_name(device) if timed else "cpu (equalities only, untimed)"
    print(f"### The target's products, {args.dtype}, {where}: us per call (weight GB/s, real rows equal linear's)\n")
    print("\n".join(lines))
    if timed:
        once = ", lm_head once" if args.lm_head else ""
        print(f"\n### One forward's products ({shape['layers']} layers x qkv, o, gate_up, down{once}), ms\n")
        print(f"| rows | {' | '.join(table_ways)} |")
        print("|---:|" + "---:|" * len(table_ways))
        for rows in args.rows:
            sums = [
                (
                    sum(results[(n, rows, w)] for n in weights(args)) * shape["layers"]
                    + results.get(("lm_head", rows, w), 0)
                )
                / 1e3
                for w in table_ways
            ]
            print(f"| {rows} | {' | '.join(f'{s:.2f}' for s in sums)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
