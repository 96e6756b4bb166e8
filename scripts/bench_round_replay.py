#!/usr/bin/env python3
"""Issue 29, item 4: how a DDTree round's wall time splits into the device's work, the round's own host
work and the decode loop's, against a plain step's, on the fast path with ``device_tree`` on.

    python scripts/bench_round_replay.py [--shape 8b] [--budgets 16,32,64] [--repeats 30] [--out DIR]

For each budget, one DDTree request and one plain request of the shaped pair (random weights, bf16),
and inside them, once their graphs are captured:

* ``loop``: the decode loop's time per round (plain: per step), as ``bench`` measures it (CUDA events
  bracketing the loop, divided by the rounds);
* ``method``: ``StaticDecoder.tree_round`` (plain: ``step``) called back to back: copying the carried
  inputs, replaying the graph, reading the result back and building the host objects;
* ``replay``: the captured graph replayed back to back with nothing read back between replays: the
  device's own time per round, the gaps between its kernels included (the floor for this graph).

``loop - method`` is the decode loop's own host work between rounds; ``method - replay`` the round's
host work and its read back. A measurement, not a test: the replays re-run one round on the same inputs,
and the method calls decode on from where the request was (their outputs are discarded).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from ddtree_conformance.adapters.interface import Request, RunConfig
from ddtree_conformance.adapters.reference import decoders
from ddtree_conformance.adapters.reference.engine import ReferenceEngine
from ddtree_conformance.testing.shaped_pair import SHAPES, build_shaped_pair, random_prompts


def _per_call_ms(fn, repeats: int) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / repeats * 1e3


def _entry(decoder, kind: str):
    entries = decoder.state.runner._entries  # a measurement script may read the runner's graphs
    for key, entry in reversed(entries.items()):
        if key[0] == kind and entry.graph is not None:
            return entry
    raise SystemExit(f"bench_round_replay: no captured {kind!r} graph (graphs off?)")


def _instrument(found: dict, budget: int, repeats: int, after: int = 3):
    """Measure inside the request once ``after`` calls have run (the graph captured and warm): the
    round's graph (read back by ``finish_round``) and the plain step's (``step``), each wrapped the same way."""
    originals = {"round": decoders.StaticDecoder.finish_round, "step": decoders.StaticDecoder.step}
    calls = {"round": 0, "step": 0}

    def measured(kind: str, again):
        real = originals[kind]

        def wrapper(self, *args):
            out = real(self, *args)
            calls[kind] += 1
            if calls[kind] == after and kind not in found:
                found[kind] = {
                    "replay": _per_call_ms(_entry(self, kind).graph.replay, repeats),
                    "method": _per_call_ms(lambda: again(real, self, args), repeats),
                }
            return out

        return wrapper

    # the round's method again from where the request is (carried inputs); the step on the same inputs
    decoders.StaticDecoder.finish_round = measured("round", lambda real, self, args: self.tree_round(budget, 0))
    decoders.StaticDecoder.step = measured("step", lambda real, self, args: real(self, *args))
    return lambda: (
        setattr(decoders.StaticDecoder, "finish_round", originals["round"])
        or setattr(decoders.StaticDecoder, "step", originals["step"])
    )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="8b")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--budgets", default="16,32,64")
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--new-tokens", type=int, default=24)
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("bench_round_replay: needs a CUDA device")
    target_dir, drafter_dir, target, drafter = build_shaped_pair(
        args.shape, getattr(torch, args.dtype), "cuda", tempfile.mkdtemp(prefix="round-replay-")
    )
    engine = ReferenceEngine(str(target_dir), str(drafter_dir))
    engine.use_models(target, drafter, RunConfig(mode="ddtree", dtype=args.dtype, device="cuda"))
    engine.fused_layers, engine.device_tree = True, True
    request = Request(
        prompt_ids=random_prompts(1, args.prompt_len, SHAPES[args.shape]["vocab"])[0], max_new_tokens=args.new_tokens
    )
    rows = []
    for budget in (int(b) for b in args.budgets.split(",")):

        def config(mode: str) -> RunConfig:
            return RunConfig(mode=mode, budget=budget, dtype=args.dtype, device="cuda", timing=True, cuda_graphs=True)

        loops = {}
        for mode in ("plain", "ddtree", "plain", "ddtree"):  # the first pair warms up and captures
            result = engine.generate([request], config(mode))[0]
            stages = result.timings.stages
            loops[mode] = stages.get("round_device", stages.get("round_wall", 0.0)) / max(result.rounds or 1, 1) * 1e3
        found: dict = {}
        restore = _instrument(found, budget, args.repeats)
        try:
            for mode in ("plain", "ddtree"):
                engine.generate([request], config(mode))
        finally:
            restore()
        row = {"budget": budget, "loop": loops, **found}
        rows.append(row)
        plain, ddtree = loops["plain"], loops["ddtree"]
        print(
            f"B={budget:4d}  plain: loop {plain:.2f} method {found['step']['method']:.2f} replay "
            f"{found['step']['replay']:.2f} ms | round: loop {ddtree:.2f} method {found['round']['method']:.2f} "
            f"replay {found['round']['replay']:.2f} ms | round/plain: loop {ddtree / plain:.2f} "
            f"replay/plain loop {found['round']['replay'] / plain:.2f} replay/replay "
            f"{found['round']['replay'] / found['step']['replay']:.2f}",
            flush=True,
        )
    meta = {
        "shape": args.shape,
        "dtype": args.dtype,
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
    }
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "round-replay.json").write_text(json.dumps({**meta, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
