#!/usr/bin/env python3
"""Issue 29, item 4: the lean forward's element-wise pieces (adapters/reference/lean.py) at a plain step's one
row and a verify's B + 1 rows, each way timed inside a CUDA graph.

The profile of the round (docs/guides/gpu-tier.md, "Where those element-wise kernels come from") found the
RMSNorm weight and the rotary embedding's products about twice as slow a kernel at 33 rows as at one: the
weight (``[H]``, or ``[heads, d]`` for q/k) and cos/sin (``[T, 1, d]``) were broadcast, and a broadcast
operand takes the slower, strided path. The ways timed, per piece:

* ``broadcast``: as transformers computes it (and lean.py did before ``RowCopies``): the weight or cos/sin
  broadcast over the rows, ``rotate_half`` with its strided negation;
* ``row copies``: as lean.py computes it now (:class:`~.lean.RowCopies`, :func:`~.lean.rotary`): the
  weight's kept per-row copy, cos/sin widened to the heads (the widening, once per forward rather than per
  layer, is timed as its own piece), and the halves swapped times a signed sin. Bit for bit the same;
* SwiGLU's ``silu(gate) * up``: on the fused GEMM's halves as lean.py takes them (``chunk``: views whose rows
  are strided, so both kernels take the strided path past one row) against the same values laid out as
  ``[2, T, I]`` (each half contiguous); and the GEMM that gives that layout (``torch.matmul`` of the rows
  against the weight's two halves, a view: ``lean.SWIGLU_HALVES``) against the one ``F.linear``. The
  element-wise ways are the same arithmetic; the GEMMs are not bound to round alike (the table says how many
  elements differ);
* ``weight in the norm`` (the hidden RMSNorm only): the weight passed to the fused ``rms_norm`` in float32, one
  rounding to the dtype instead of two. Not the same arithmetic: the table says how many elements differ.

    python scripts/bench_elementwise.py [--rows 1 17 33 65] [--hidden 4096] [--heads 32 --kv-heads 8 --head-dim 128]

Per piece, rows and way: microseconds per call (the median of five timings of a graph holding ``--calls`` calls,
replayed ``--replays`` times), and the share of output elements that differ from ``broadcast``. A
measurement, not a test; it needs a CUDA device (``--device cpu`` checks only the equalities, with no timing).
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from transformers.models.qwen3.modeling_qwen3 import rotate_half

from ddtree_conformance.adapters.reference.clock import graph_replay_us
from ddtree_conformance.adapters.reference.lean import RowCopies, rotary


def _rms_broadcast(x, weight, eps):
    return weight * F.rms_norm(x.float(), (x.shape[-1],), eps=eps).to(x.dtype)


def _rms_in_norm(x, weight, eps):
    return F.rms_norm(x.float(), (x.shape[-1],), weight.float(), eps=eps).to(x.dtype)


def _rope_broadcast(x, cos, sin):
    return x * cos + rotate_half(x) * sin


def _swiglu(gate, up):
    return F.silu(gate) * up


def _halves_by_linear(x, weight):
    return F.linear(x, weight)


def _halves_by_matmul(x, halves):
    return torch.matmul(x, halves)


def _pieces(rows: int, args, device, dtype):
    """``{piece: {way: (fn, inputs)}}`` for ``rows`` rows; the first way is the one others are compared with."""
    g = torch.Generator().manual_seed(rows)

    def draw(*shape):
        return torch.randn(*shape, generator=g).to(dtype).to(device)

    heads = args.heads + args.kv_heads
    hidden, qk = draw(rows, args.hidden), draw(rows, heads, args.head_dim)
    weight, qk_weight = draw(args.hidden) * 0.1 + 1, draw(heads, args.head_dim) * 0.1 + 1
    cos, sin = draw(rows, 1, args.head_dim), draw(rows, 1, args.head_dim)
    copies, eps = RowCopies(), 1e-6
    wide_cos, signed_sin = copies.rotary(cos, sin, heads)
    gate_up = draw(rows, 2 * args.inter)
    split = gate_up.view(rows, 2, args.inter).transpose(0, 1).contiguous()  # the same values, [2, T, I]
    gate_up_weight = draw(2 * args.inter, args.hidden) * args.hidden**-0.5
    halves = gate_up_weight.view(2, args.inter, args.hidden).transpose(1, 2)  # [2, H, I], a view (as lean.py)

    def as_linear(out):  # [2, T, I] -> [T, 2I], for the comparison only
        return out.transpose(0, 1).reshape(rows, 2 * args.inter)

    return {
        "RMSNorm [T, H]": {
            "broadcast": (_rms_broadcast, (hidden, weight, eps)),
            "row copies": (_rms_broadcast, (hidden, copies.weight(weight, hidden), eps)),
            "weight in the norm": (_rms_in_norm, (hidden, weight, eps)),
        },
        "q/k RMSNorm [T, heads, d]": {
            "broadcast": (_rms_broadcast, (qk, qk_weight, eps)),
            "row copies": (_rms_broadcast, (qk, copies.weight(qk_weight, qk), eps)),
        },  # no "weight in the norm": q's and k's weights differ, so one fused call cannot hold both
        "rotary [T, heads, d]": {
            "broadcast": (_rope_broadcast, (qk, cos, sin)),
            "row copies": (rotary, (qk, wide_cos, signed_sin)),
        },
        "cos/sin widened (once per forward)": {"row copies": (lambda c, s: copies.rotary(c, s, heads)[0], (cos, sin))},
        "SwiGLU silu(gate) * up [T, I]": {
            "chunks of [T, 2I]": (_swiglu, gate_up.chunk(2, dim=-1)),
            "halves of [2, T, I]": (_swiglu, (split[0], split[1])),
        },
        "gate/up GEMM [T, H] -> 2 x [T, I]": {
            "F.linear, [T, 2I]": (_halves_by_linear, (hidden, gate_up_weight)),
            "torch.matmul on the halves, [2, T, I]": (_halves_by_matmul, (hidden, halves), as_linear),
        },
    }


def _graph_us(fn, inputs, calls: int, replays: int) -> float:
    """Microseconds per call of ``fn(*inputs)``, ``calls`` of them captured in one graph."""

    def work():
        for _ in range(calls):
            fn(*inputs)

    return graph_replay_us(work, replays)[0] / calls


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, nargs="+", default=[1, 17, 33, 65], help="row counts (T) to time")
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--inter", type=int, default=12288, help="the MLP's width (gate and up each)")
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--calls", type=int, default=144, help="calls per graph (an 8B target: 36 layers x 4 norms)")
    p.add_argument("--replays", type=int, default=50)
    args = p.parse_args(argv)
    timed = args.device == "cuda"
    if timed and not torch.cuda.is_available():
        raise SystemExit("bench_elementwise: needs a CUDA device to time (none found); --device cpu: equality only")
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    where = torch.cuda.get_device_name(0) if timed else "CPU (equality only)"
    print(f"{where}, {args.dtype}, us per call inside a CUDA graph of {args.calls} calls")
    print("| piece | rows | way | us per call | share of elements differing from the first way |")
    print("|---|---:|---|---:|---:|")
    for rows in args.rows:
        for piece, ways in _pieces(rows, args, device, dtype).items():
            fn0, inputs0, *_ = next(iter(ways.values()))
            want = fn0(*inputs0)
            for way, (fn, inputs, *to_first) in ways.items():
                got = fn(*inputs)
                got = to_first[0](got) if to_first else got
                differing = (got != want).float().mean().item() if got.shape == want.shape else float("nan")
                us = _graph_us(fn, inputs, args.calls, args.replays) if timed else float("nan")
                print(f"| {piece} | {rows} | {way} | {us:.2f} | {differing:.2e} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
