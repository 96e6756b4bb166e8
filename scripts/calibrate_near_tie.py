"""Measure a pair's low-precision noise model on one device and merge it into the pair's MANIFEST.json.

    python scripts/calibrate_near_tie.py --model golden/fixture/target --drafter golden/fixture/drafter --device cuda
    # the correct engines that round differently, one process per engine and dtype (16 cores: --jobs 16)
    python scripts/calibrate_near_tie.py --drafter golden/fixture/drafter --engines all --jobs 14 --device cpu

Sequences: every prompt of the set plus its fp32 plain greedy output from the reference engine.
Measured per dtype, for the reference (``--engines reference``, the default) and for each correct
engine of ``ddtree_conformance.testing.rounding_engines`` named (``--engines all`` or labels / class
names, comma-separated): the target's top-2 gap shift (near-tie bound and excused-position ceiling),
the drafter's logit shift (drafter tolerance), the rounds that differ from the fp32 replay on the
drafter side, by direction, and the per-round length gain (round caps and the tau test), and for
the engines their tie counts against the reference. See conformance/calibration.py and
conformance/noise.py for the derivations.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed

from ddtree_conformance.adapters.interface import Request, RunConfig
from ddtree_conformance.adapters.reference.engine import ReferenceEngine
from ddtree_conformance.calibrate import calibrate, calibrate_engine
from ddtree_conformance.calibration import load_calibration
from ddtree_conformance.prompts import load_prompts
from ddtree_conformance.testing.rounding_engines import ROUNDING_ENGINES


def _engines(names: str) -> dict[str, type]:
    known = {cls.__name__: cls for cls in ROUNDING_ENGINES.values()}
    known.update({label: cls for label, cls in ROUNDING_ENGINES.items()})
    chosen = {}
    for name in (n.strip() for n in names.split(",") if n.strip()):
        if name == "reference":
            chosen["reference"] = None
        elif name == "all":
            chosen.update({cls.__name__: cls for cls in ROUNDING_ENGINES.values()})
        elif name in known:
            chosen[known[name].__name__] = known[name]
        else:
            sys.exit(f"error: --engines: unknown engine {name!r}; known: reference, all, {', '.join(sorted(known))}")
    return chosen


def _job(args, name, engine_class, dtype, sequences, requests) -> tuple[str, str, float, dict]:
    import torch

    if args.device == "cpu" and args.jobs > 1:
        torch.set_num_threads(1)
    t0 = time.time()
    if engine_class is None:
        data = calibrate(
            args.model,
            [dtype],
            sequences,
            args.device,
            drafter_dir=args.drafter,
            manifest=args.manifest,
            requests=requests if args.drafter else None,
            budgets=_budgets(args),
        )
        entry = data["measured"][f"{dtype}@{torch.device(args.device).type}"]
    else:
        entry = calibrate_engine(
            engine_class,
            name,
            args.model,
            args.drafter,
            dtype,
            sequences,
            requests,
            args.device,
            args.manifest,
            _budgets(args),
        )
    summary = {k: entry.get(k) for k in ("max_shift", "drafter_max_shift", "drafter_rounds", "drafter_longer")}
    summary.update(
        {k: entry.get(k) for k in ("drafter_shorter", "round_gain", "tie_engine_only", "tie_reference_only")}
    )
    return name, dtype, time.time() - t0, summary


def _budgets(args) -> tuple[int, ...]:
    return tuple(int(b) for b in args.budgets.split(","))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="golden/fixture/target")
    parser.add_argument("--drafter", default=None)
    parser.add_argument("--prompts", default="fixture")
    parser.add_argument("--limit", type=int, default=None, help="first N prompts only")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--dtypes", nargs="+", default=["bfloat16", "float16"])
    parser.add_argument("--budgets", default="16,64,256", help="DDTree budgets of the round measurement")
    parser.add_argument("--flip-limit", type=int, default=None, help="prompts of the round measurement")
    parser.add_argument("--engines", default="reference", help="reference, all, or engine names, comma-separated")
    parser.add_argument("--jobs", type=int, default=1, help="processes at once (one per engine and dtype)")
    parser.add_argument("--manifest", default=None, help="write here instead of the pair's MANIFEST.json")
    parser.add_argument(
        "--target-only",
        action="store_true",
        help="measure the reference target's gap shifts only; keep the drafter values already measured",
    )
    args = parser.parse_args(argv)
    t0 = time.time()
    engines = _engines(args.engines)
    if any(cls is not None for cls in engines.values()) and not args.drafter:
        sys.exit("error: --engines other than reference need --drafter")
    prompts = load_prompts(args.prompts, tokenizer_dir=args.model)[: args.limit]
    requests = [Request(prompt_ids=p.prompt_ids, max_new_tokens=args.max_new_tokens) for p in prompts]
    engine = ReferenceEngine(args.model)
    results = engine.generate(requests, RunConfig(mode="plain", device=args.device))
    engine.close()
    sequences = [p.prompt_ids + r.output_ids for p, r in zip(prompts, results)]
    if args.target_only:
        args.drafter = None
    requests = requests[: args.flip_limit]
    jobs = [(name, cls, dtype) for name, cls in engines.items() for dtype in args.dtypes]
    failed = 0
    if args.jobs > 1:
        import multiprocessing

        # spawned, not forked: the parent already ran torch (threads, CUDA)
        with ProcessPoolExecutor(max_workers=args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = [pool.submit(_job, args, n, c, d, sequences, requests) for n, c, d in jobs]
            for future in as_completed(futures):
                try:
                    name, dtype, seconds, summary = future.result()
                    print(f"{name} {dtype}: {seconds:.0f} s {json.dumps(summary)}", flush=True)
                except Exception as exc:  # one engine's failure is reported, the others go on
                    failed += 1
                    print(f"error: a calibration job failed: {type(exc).__name__}: {exc}", flush=True)
    else:
        for name, cls, dtype in jobs:
            name, dtype, seconds, summary = _job(args, name, cls, dtype, sequences, requests)
            print(f"{name} {dtype}: {seconds:.0f} s {json.dumps(summary)}", flush=True)
    if not args.manifest:
        for dtype in args.dtypes:
            model = load_calibration(args.model, dtype)
            print(model.describe())
            print(
                f"  longer {model.longer_rate:.4f} shorter {model.shorter_rate:.4f} gain/round "
                f"{model.gain_per_round:+.4f} tie share {model.tie_share:.3f}; {len(model.calibrated_on)} sources"
            )
    print(f"calibrated in {time.time() - t0:.0f} s", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
