"""Measure a pair's low-precision calibration on one device and merge it into the pair's MANIFEST.json.

    python scripts/calibrate_near_tie.py --model golden/fixture/target --drafter golden/fixture/drafter --device cuda

Sequences: every prompt of the set plus its fp32 plain greedy output from the reference engine.
Measured per dtype: the target's top-2 gap shift (near-tie bound and excused-position ceiling),
the drafter's logit shift (drafter tolerance) and, with ``--drafter``, the share of rounds whose
tree flips when the reference runs in that dtype and is replayed in fp32 (drafter round cap). See
conformance/calibration.py for the derivations.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from ddtree_conformance.adapters.interface import Request, RunConfig
from ddtree_conformance.adapters.reference.engine import ReferenceEngine
from ddtree_conformance.calibrate import calibrate
from ddtree_conformance.calibration import load_calibration
from ddtree_conformance.prompts import load_prompts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="golden/fixture/target")
    parser.add_argument("--drafter", default=None)
    parser.add_argument("--prompts", default="fixture")
    parser.add_argument("--limit", type=int, default=None, help="first N prompts only")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--dtypes", nargs="+", default=["bfloat16", "float16"])
    parser.add_argument("--budgets", default="16,64,256", help="budgets of the drafter round flip measurement")
    parser.add_argument("--flip-limit", type=int, default=None, help="prompts of the drafter round flip measurement")
    parser.add_argument("--manifest", default=None, help="write here instead of the pair's MANIFEST.json")
    parser.add_argument(
        "--target-only",
        action="store_true",
        help="measure the target's gap shifts only; keep the drafter values already measured",
    )
    args = parser.parse_args(argv)
    t0 = time.time()
    prompts = load_prompts(args.prompts, tokenizer_dir=args.model)[: args.limit]
    requests = [Request(prompt_ids=p.prompt_ids, max_new_tokens=args.max_new_tokens) for p in prompts]
    engine = ReferenceEngine(args.model)
    results = engine.generate(requests, RunConfig(mode="plain", device=args.device))
    engine.close()
    sequences = [p.prompt_ids + r.output_ids for p, r in zip(prompts, results)]
    drafter = None if args.target_only else args.drafter
    data = calibrate(
        args.model,
        args.dtypes,
        sequences,
        args.device,
        drafter_dir=drafter,
        manifest=args.manifest,
        requests=requests[: args.flip_limit] if drafter else None,
        budgets=tuple(int(b) for b in args.budgets.split(",")),
    )
    print(json.dumps(data, indent=1))
    if not args.manifest:
        for dtype in args.dtypes:
            print(load_calibration(args.model, dtype).describe())
    print(f"calibrated in {time.time() - t0:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
