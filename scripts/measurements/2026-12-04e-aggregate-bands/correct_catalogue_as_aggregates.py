"""Run every engine of the correct catalogue as an aggregate-only engine (acceptance/ddtree, 20 prompts).

Usage: python correct_catalogue_as_aggregates.py float32|bfloat16 [OUT.json]
Prints one line per result and writes the rows as JSON (default /tmp/corr_agg_<dtype>.json).
"""

import json
import sys

import torch

from ddtree_conformance.paths import FIXTURE_DRAFTER, FIXTURE_TARGET
from ddtree_conformance.session import SuiteSettings
from ddtree_conformance.testing.correct_engines import CORRECT_ENGINES
from ddtree_conformance.testing.rounding_engines import aggregate_box
from ddtree_conformance.testing.runs import plan_and_run


def main(dtype: str, out: str) -> None:
    torch.set_num_threads(1)
    settings = SuiteSettings(
        model_dir=str(FIXTURE_TARGET),
        drafter_dir=str(FIXTURE_DRAFTER),
        prompt_set="fixture",
        pair_name="fixture",
        budgets=[16],
        limit=20,
        max_new_tokens=64,
        isolate=False,
        dtype=dtype,
        device="cpu",
        run_seed=1,
    )
    rows = []
    for label, cls in CORRECT_ENGINES.items():
        try:
            for r in plan_and_run(settings, aggregate_box(cls), ["acceptance/ddtree"]):
                rows.append((label, r.check, r.status, r.message[:230]))
                print(label, "|", r.check, "|", r.status, "|", r.message[:230], flush=True)
        except Exception as e:  # noqa: BLE001 - a measurement sweep records the error and goes on
            print(label, "ERROR", type(e).__name__, str(e)[:200], flush=True)
    with open(out, "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else f"/tmp/corr_agg_{sys.argv[1]}.json")
