"""A lossless engine that verifies a smaller tree than asked (B = 16 asked, ``b`` verified), as an aggregate-only
engine: where does the aggregate path start failing it?

    python smaller_tree.py DTYPE OUT.json [--rounds] [--limit 20] [--verified 15,14,12,10,8]

``--rounds``: the engine reports its number of rounds too (``aggregate_box(..., rounds=True)``). The ``before``
files ran this on the code before the ways of counting (commit 5d8b94d, without ``--rounds``).
"""

from __future__ import annotations

import argparse
import json

import torch

from ddtree_conformance.adapters.reference.engine import ReferenceEngine
from ddtree_conformance.testing.rounding_engines import aggregate_box
from ddtree_conformance.testing.runs import fixture_pair_settings, plan_and_run


def smaller(verified: int) -> type[ReferenceEngine]:
    class SmallerTree(ReferenceEngine):
        name = f"smaller-tree-{verified}"

        def generate(self, requests, config):
            if config.mode == "ddtree":
                config = config.model_copy(update={"budget": verified})
            return super().generate(requests, config)

    return SmallerTree


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("dtype")
    parser.add_argument("out")
    parser.add_argument("--rounds", action="store_true")
    parser.add_argument("--limit", type=int, default=20)
    parser.add_argument("--verified", default="15,14,12,10,8")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    for verified in (int(v) for v in args.verified.split(",")):
        settings = fixture_pair_settings(
            limit=args.limit, max_new_tokens=64, budgets=[16], dtype=args.dtype, run_seed=1
        )
        box = aggregate_box(smaller(verified), rounds=True) if args.rounds else aggregate_box(smaller(verified))
        (result,) = plan_and_run(settings, box, ["acceptance/ddtree"])
        d = result.details
        rows.append({"verified": verified, "status": result.status, "tau": d.get("tau"), "message": result.message})
        print(args.dtype, verified, result.status, result.message[:200], flush=True)
    with open(args.out, "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
