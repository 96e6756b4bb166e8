"""Low-precision excuse farming on the fixture pair: the bf16 adversaries of issue 20 against the checks
that judge them, on every prompt, beside the correct reference (and any other engine named).

    python scripts/excuse_farming.py                       # bf16, all 80 prompts, the default engines
    python scripts/excuse_farming.py --limit 20 --engines reference,runner-up
    python scripts/excuse_farming.py --engines ddtree_conformance.testing.correct_engines:OutputsOnly

Engines: ``reference``, ``runner-up`` (:class:`~ddtree_conformance.testing.adversaries.RunnerUpUnder005`),
``forged`` (:class:`~ddtree_conformance.testing.adversaries.ForgedAcceptance`), ``sibling-peek`` and
``sibling-peek-black-box``, or any ``module:Class``. Prints one line per check (engine, check, status, the
message's head) and each engine's wall time; ``--out FILE`` keeps every result as JSON. The per-run checks
judge B=16; the near-tie check pools plain, DFlash and DDTree at B=16, 64 and 256 (``--modes``, ``--budgets``).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time

import torch

from ddtree_conformance.adapters.reference.engine import ReferenceEngine
from ddtree_conformance.paths import FIXTURE_DRAFTER, FIXTURE_TARGET
from ddtree_conformance.session import SuiteSettings
from ddtree_conformance.testing import adversaries as adv
from ddtree_conformance.testing.runs import plan_and_run

ENGINES = {
    "reference": ReferenceEngine,
    "runner-up": adv.RunnerUpUnder005,
    "forged": adv.ForgedAcceptance,
    "sibling-peek": adv.SiblingPeek,
    "sibling-peek-black-box": adv.SiblingPeekBlackBox,
}
CHECKS = [
    "lossless/ddtree-B16",
    "golden/ddtree-B16",
    "acceptance/ddtree-B16",
    "tree-structure/ddtree-B16",
    "branch-vs-chain/ddtree-B16",
    "near-ties",
]


def engine_class(name: str):
    if name in ENGINES:
        return ENGINES[name]
    module, _, attr = name.partition(":")
    return getattr(importlib.import_module(module), attr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--limit", type=int, default=80)
    parser.add_argument("--modes", default="dflash,ddtree", help="the runs near-ties pools (with plain)")
    parser.add_argument("--budgets", default="16,64,256")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--checks", default=",".join(CHECKS))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--run-seed", type=int, default=1, help="seed of the held-out prompts and request order")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    settings = SuiteSettings(
        model_dir=str(FIXTURE_TARGET),
        drafter_dir=str(FIXTURE_DRAFTER),
        dtype=args.dtype,
        limit=args.limit,
        budgets=[int(b) for b in args.budgets.split(",")],
        modes=args.modes.split(","),
        max_new_tokens=args.max_new_tokens,
        isolate=False,
        torch_threads=args.threads,
        run_seed=args.run_seed,
    )
    names = args.checks.split(",")
    rows = []
    for name in args.engines.split(","):
        cls = engine_class(name)
        started = time.perf_counter()
        results = plan_and_run(settings, cls, names)
        elapsed = time.perf_counter() - started
        for r in results:
            rows.append(
                {
                    "engine": name,
                    "check": r.check,
                    "status": r.status,
                    "message": r.message,
                    "elapsed_s": r.details.get("elapsed_s"),
                    "details": r.details,
                }
            )
            head = " ".join(r.message.split())
            print(f"{name:24} {r.check:28} {r.status:5} {head[:300]}", flush=True)
        print(f"{name:24} {'(all checks)':28} {elapsed:6.1f} s", flush=True)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as handle:
            json.dump({"settings": settings.model_dump(), "rows": rows}, handle, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
