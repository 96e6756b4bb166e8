"""Measure the bf16/fp16 near-tie bound of a pair on one device and merge it into calibration.json.

    python scripts/calibrate_near_tie.py --model golden/fixture/target --drafter golden/fixture/drafter --device cuda

Sequences: every prompt of the set plus its fp32 plain greedy output from the reference engine.
See conformance/calibration.py for the derivation.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ddtree_conformance.adapters.interface import Request, RunConfig  # noqa: E402
from ddtree_conformance.adapters.reference.engine import ReferenceEngine  # noqa: E402
from ddtree_conformance.calibration import calibrate  # noqa: E402
from ddtree_conformance.prompts import load_prompts  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="golden/fixture/target")
    parser.add_argument("--prompts", default="fixture")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--dtypes", nargs="+", default=["bfloat16", "float16"])
    args = parser.parse_args()
    prompts = load_prompts(args.prompts, tokenizer_dir=args.model)
    engine = ReferenceEngine(args.model)
    results = engine.generate([Request(prompt_ids=p.prompt_ids, max_new_tokens=args.max_new_tokens) for p in prompts],
                              RunConfig(mode="plain", device=args.device))
    sequences = [p.prompt_ids + r.output_ids for p, r in zip(prompts, results)]
    data = calibrate(args.model, args.dtypes, sequences, args.device)
    print(json.dumps(data, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
