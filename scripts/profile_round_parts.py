#!/usr/bin/env python
"""Where the fast-device round's device time goes, part by part (issue 29 item 4).

    python scripts/profile_round_parts.py --shape 8b --budgets 16 64 --out $OUT/round-parts

``profile_round.py`` profiles the round as it ships: one CUDA graph, so every kernel of the round is
launched by one ``cudaGraphLaunch`` and cannot be told apart by the code that queued it. This script
runs the same round with graph capture off (the same tensors, shapes and kernels, launched one by one),
with a profiler range around each part of :meth:`StaticDecoder.launch_round`:

* ``tree``: the spec's tree from the drafter's logits (top-K and beams, :mod:`.device_tree`);
* ``verify inputs``: the tree's ids and visibility (:mod:`.device_verify`);
* ``target forward``: the target's forward over the tree's rows (lean or transformers');
* ``walk``: the greedy walk (:mod:`.device_walk`);
* ``drafter forward``: the next draft's layers, and ``lm_head`` wherever the vocabulary projection runs;
* ``plain step``: one plain decode step (its target forward over one row), profiled the same way first,
  so that the round's forward over the tree's rows can be held against it;
* what is left inside a part's parent (the mask over the cache, the commit's cache moves, the packed
  read back's concatenation) is charged to the parent as ``(rest)``.

Each kernel is charged to the innermost part open on the host when it was launched (the launch's
runtime call and the kernel share a correlation id), and the table gives device ms per round for each
path of nested parts, with the kernel count. Eager launches leave the device idle between kernels, so
only the device time of the kernels is comparable to the graph's, not the span; the table gives the
eager round's total device time beside the parts so the two can be held against ``profile_round.py``.
Writes ``OUT/parts.md`` and ``OUT/parts.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import torch

from ddtree_conformance.adapters.interface import Request, RunConfig
from ddtree_conformance.adapters.reference import decoders, graphs, lean
from ddtree_conformance.adapters.reference.engine import ReferenceEngine
from ddtree_conformance.testing.shaped_pair import SHAPES, build_shaped_pair, random_prompts

PREFIX = "part:"
ROUND = "round"
STEP = "plain step"
TOP = 6  # kernels listed under each part
# (module or class, attribute, part): each wrapped in a profiler range named PREFIX + part
PARTS = (
    (decoders.StaticDecoder, "launch_round", ROUND),
    (decoders.StaticDecoder, "step", STEP),
    (decoders.StaticDecoder, "_verified_round", "verified round"),
    (decoders, "build_tree_with_ancestors", "tree"),
    (decoders, "verify_inputs_on_device", "verify inputs"),
    (decoders, "greedy_walk_on_device", "walk"),
    (lean.LeanQwen3, "forward", "target forward"),
    (decoders.StaticDecoder, "_commit_and_draft", "commit and draft"),
    (lean.LeanDFlash, "forward", "drafter forward"),
)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="8b")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--budgets", type=int, nargs="+", default=[16, 64])
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--new-tokens", type=int, default=24)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--out", type=Path, required=True)
    return p.parse_args(argv)


def _ranged(fn, part: str):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with torch.profiler.record_function(PREFIX + part):
            return fn(*args, **kwargs)

    return wrapper


@contextlib.contextmanager
def parts_marked(vocab: int):
    """Every part of :data:`PARTS` in a profiler range, the vocabulary projection (a linear layer with
    ``vocab`` outputs) as ``lm_head``, and graph capture off; all restored on exit."""
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in PARTS]
    saved.append((graphs.GraphRunner, "_capture", graphs.GraphRunner._capture))
    project = torch.nn.Linear.forward
    try:
        for owner, name, part in PARTS:
            setattr(owner, name, _ranged(getattr(owner, name), part))

        def eager(self, entry, fn):  # the runner's capture path, run eagerly each call
            return fn(entry.static)

        graphs.GraphRunner._capture = eager

        def linear(self, x):  # only the vocabulary projection gets a range of its own
            if self.out_features == vocab:
                with torch.profiler.record_function(PREFIX + "lm_head"):
                    return project(self, x)
            return project(self, x)

        torch.nn.Linear.forward = linear
        yield
    finally:
        torch.nn.Linear.forward = project
        for owner, name, original in saved:
            setattr(owner, name, original)


def attribute(kernels, launches, ranges, rounds: int) -> dict:
    """Device ms per round, kernel count and the heaviest kernels for each path of nested parts.

    ``kernels``: ``(correlation, device_ns, name)``; ``launches``: ``{correlation: host_start_ns}`` (the
    runtime call that queued each kernel); ``ranges``: ``(start_ns, end_ns, part)`` on the host. A
    kernel goes to the path of parts open at its launch, outermost first and joined by `` > ``
    (``outside the round`` when no part was open, ``(unmatched launch)`` without its runtime call)."""
    per = max(1, rounds)
    ordered = sorted(ranges, key=lambda r: (r[0], -r[1]))
    table: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    names: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(lambda: [0, 0.0]))
    for correlation, device_ns, name in kernels:
        at = launches.get(correlation)
        if at is None:
            path = "(unmatched launch)"
        else:
            path = " > ".join(part for start, end, part in ordered if start <= at < end) or "outside the round"
        table[path][0] += 1
        table[path][1] += device_ns
        names[path][name[:90]][0] += 1
        names[path][name[:90]][1] += device_ns
    return {
        path: {
            "kernels_per_round": n / per,
            "device_ms_per_round": ns / 1e6 / per,
            "top": [
                {"kernel": k, "calls_per_round": c / per, "ms_per_round": t / 1e6 / per}
                for k, (c, t) in sorted(names[path].items(), key=lambda kv: -kv[1][1])[:TOP]
            ],
        }
        for path, (n, ns) in sorted(table.items())
    }


def markdown(meta: dict, parts: dict, root: str = ROUND) -> str:
    """The table of one profiled call: every path of parts, the share of those under ``root``, and the
    heaviest kernels under each path."""
    inside = {p: v for p, v in parts.items() if p.startswith(root)}
    total = sum(v["device_ms_per_round"] for v in inside.values())
    what = f"B={meta['budget']}" if root == ROUND else "one plain step"
    lines = [
        f"### The fast-device {root} by part: {meta['shape']}-shaped pair, {meta['dtype']}, {what}, "
        f"{meta['device_name']}, torch {meta['torch']} (graph capture off; {meta['rounds']} rounds)",
        "",
        f"Device time of the {root}'s kernels: **{total:.3f} ms per round** (launched one by one; the graph's "
        "own device time is in profile_round.py's table).",
        "",
        "| part (innermost last) | kernels per round | device ms per round | share |",
        "|---|---:|---:|---:|",
    ]
    ranked = sorted(parts.items(), key=lambda kv: -kv[1]["device_ms_per_round"])
    for path, v in ranked:
        share = f"{v['device_ms_per_round'] / total:.1%}" if path in inside and total else ""
        lines.append(f"| {path} | {v['kernels_per_round']:.1f} | {v['device_ms_per_round']:.3f} | {share} |")
    lines += ["", "| part | kernel | calls per round | ms per round |", "|---|---|---:|---:|"]
    for path, v in ranked:
        if path in inside:
            lines += [
                f"| {path} | `{k['kernel']}` | {k['calls_per_round']:.1f} | {k['ms_per_round']:.3f} |"
                for k in v.get("top", [])
            ]
    return "\n".join(lines) + "\n"


def from_profile(prof, rounds: int) -> dict:
    events = list(prof.profiler.kineto_results.events())
    cuda = torch.autograd.DeviceType.CUDA
    kernels = [  # kernels, copies and fills; not the ranges' mirrors on the device's timeline
        (e.correlation_id(), e.duration_ns(), e.name())
        for e in events
        if e.device_type() == cuda and not e.is_user_annotation() and not e.name().startswith(PREFIX)
    ]
    launches = {
        e.correlation_id(): e.start_ns()
        for e in events
        if e.device_type() != cuda and e.correlation_id() and not e.name().startswith(PREFIX)
    }
    ranges = [
        (e.start_ns(), e.start_ns() + e.duration_ns(), e.name()[len(PREFIX) :])
        for e in events
        if e.device_type() != cuda and e.name().startswith(PREFIX)
    ]
    return attribute(kernels, launches, ranges, rounds)


def main(argv=None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("profile_round_parts: needs a CUDA device (none found)")
    args.out.mkdir(parents=True, exist_ok=True)
    target_dir, drafter_dir, target, drafter = build_shaped_pair(
        args.shape, getattr(torch, args.dtype), args.device, tempfile.mkdtemp(prefix="round-parts-")
    )
    engine = ReferenceEngine(str(target_dir), str(drafter_dir), device_tree="on")
    engine.use_models(target, drafter, RunConfig(mode="ddtree", dtype=args.dtype, device=args.device))
    request = Request(
        prompt_ids=random_prompts(1, args.prompt_len, SHAPES[args.shape]["vocab"])[0], max_new_tokens=args.new_tokens
    )
    from torch.profiler import ProfilerActivity, profile

    results, texts = {}, []
    for budget in ("plain", *args.budgets):  # the plain step first: its target forward over one row
        mode = "plain" if budget == "plain" else "ddtree"
        config = RunConfig(
            mode=mode,
            budget=1 if budget == "plain" else budget,
            dtype=args.dtype,
            device=args.device,
            timing=True,
            cuda_graphs=True,
        )
        with parts_marked(SHAPES[args.shape]["vocab"]):
            for _ in range(args.warmup):
                engine.generate([request], config)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                result = engine.generate([request], config)[0]
                torch.cuda.synchronize()
        meta = {
            "shape": args.shape,
            "dtype": args.dtype,
            "budget": budget,
            "rounds": result.rounds or 0,
            "torch": torch.__version__,
            "device_name": torch.cuda.get_device_name(0),
        }
        results[budget] = {**meta, "parts": from_profile(prof, meta["rounds"])}
        texts.append(markdown(meta, results[budget]["parts"], STEP if mode == "plain" else ROUND))
        print(texts[-1], flush=True)
    (args.out / "parts.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    (args.out / "parts.md").write_text("\n".join(texts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
