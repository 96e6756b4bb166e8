#!/usr/bin/env python
"""The acceptance check's aggregate path, measured: how wide the per-prompt tau band is for correct engines
that round differently, and what a broken one can hide in it.

    python scripts/aggregate_bands.py --dtypes bfloat16 float16 --limits 7 20 40 --run-seed 1 --json OUT.json
    python scripts/aggregate_bands.py --summarise OUT*.json [--margins 0.03,0.05 0.10,0.10]

Every engine reports aggregates only (``testing.rounding_engines.aggregate_box``: per request its mean
acceptance length and the acceptance rate per depth; no rounds, no traces). For each dtype and ``--limit``
the ``acceptance/ddtree`` check runs on the fixture pair (the default plan's prompts, held-out ones
included, and budgets) for:

* the correct engines of ``testing/rounding_engines.py`` (every one must pass): how far their bands reach,
  relative to the reference's tau;
* the mutants that keep the outputs and lose acceptance (``--mutants``): where their bands sit.

One row per engine, dtype, limit and budget: the verdict, tau, the reference's tau, the band and its ends
relative to the reference's tau. The table tells which equivalence margin every correct engine meets at
the default scale and which deficit a band of that width can still hide.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from ddtree_conformance.files import atomic_write
from ddtree_conformance.paths import FIXTURE_DRAFTER, FIXTURE_TARGET
from ddtree_conformance.session import SuiteSettings
from ddtree_conformance.testing.mutants import MUTANTS
from ddtree_conformance.testing.rounding_engines import ROUNDING_ENGINES, aggregate_box
from ddtree_conformance.testing.runs import plan_and_run

LOSSLESS_SLOWER = ("first-rows-feedback", "drafter-positions-off-by-one", "mask-id-dropped", "nonzero-tree-size")


def rows_for(label: str, engine, settings: SuiteSettings, correct: bool) -> list[dict]:
    started = time.time()
    results = plan_and_run(settings, aggregate_box(engine), ["acceptance/ddtree"])
    rows = []
    for r in results:
        d = r.details
        ref = d.get("reference_tau")
        band = d.get("band")
        rows.append(
            {
                "engine": label,
                "correct": correct,
                "dtype": settings.dtype,
                "limit": settings.limit,
                "check": r.check,
                "status": r.status,
                "tau": d.get("tau"),
                "reference_tau": ref,
                "band": band,
                "prompts": d.get("prompts"),
                "band_relative": [b / ref for b in band] if band and ref else None,
                "bands": d.get("bands"),
                "fail_bands": d.get("fail_bands"),
                "margins": d.get("margins"),
                # how far the widest comparison reaches, as a share of its margin (1: at the margin)
                "reach": max(
                    (max(abs(lo), abs(hi)) / m for (lo, hi), m in zip(d["bands"].values(), d["margins"]) if m),
                    default=None,
                )
                if d.get("bands")
                else None,
                "message": r.message,
                "seconds": round(time.time() - started, 1),
            }
        )
    return rows


def table(rows: list[dict]) -> str:
    lines = [
        "| engine | correct | dtype | limit | check | verdict | tau | reference tau | tau band | band / reference tau "
        "| widest reach / margin |",
        "|---|---|---|---:|---|---|---:|---:|---|---|---:|",
    ]
    for r in rows:
        band = "-" if not r["band"] else f"[{r['band'][0]:.3f}, {r['band'][1]:.3f}]"
        rel = "-" if not r["band_relative"] else f"[{r['band_relative'][0]:+.1%}, {r['band_relative'][1]:+.1%}]"
        tau = "-" if r["tau"] is None else f"{r['tau']:.3f}"
        ref = "-" if r["reference_tau"] is None else f"{r['reference_tau']:.3f}"
        reach = "-" if r["reach"] is None else f"{r['reach']:.2f}"
        lines.append(
            f"| {r['engine']} | {'yes' if r['correct'] else 'no'} | {r['dtype']} | {r['limit']} | {r['check']} | "
            f"{r['status']} | {tau} | {ref} | {band} | {rel} | {reach} |"
        )
    return "\n".join(lines)


def decide(row: dict, tau_margin: float, depth_margin: float) -> str:
    """The check's decision on a recorded row's bands at other margins (the bands do not depend on them)."""
    if not row.get("bands"):
        return row["status"]
    margins = [tau_margin * row["reference_tau"]] + [depth_margin] * (len(row["bands"]) - 1)
    if any(hi < -m or lo > m for (lo, hi), m in zip(row["fail_bands"].values(), margins)):
        return "fail"
    if all(-m <= lo and hi <= m for (lo, hi), m in zip(row["bands"].values(), margins)):
        return "pass"
    return "skip"


def summarise(paths: list[str], margins: list[tuple[float, float]]) -> str:
    """Per margin pair, correct and broken engines, and limit: the decisions on the recorded bands, and the
    widest 95 % band of a correct engine (share of tau, and on a depth's rate)."""
    rows = [r for path in paths for r in json.loads(open(path).read())]
    limits = sorted({r["limit"] for r in rows})
    lines = [f"{len(rows)} rows from {len(paths)} files", ""]
    for limit in limits:
        correct = [r for r in rows if r["correct"] and r["limit"] == limit and r.get("bands")]
        if correct:
            tau = max(max(abs(x) for x in r["bands"]["mean tau"]) / r["reference_tau"] for r in correct)
            depth = max(abs(x) for r in correct for k, v in r["bands"].items() if k != "mean tau" for x in v)
            lines.append(f"limit {limit}: widest correct band {tau:.2%} of tau, {depth:.3f} on a depth's rate")
    lines += [
        "",
        "| tau margin | depth margin | engines | limit | pass | fail | cannot vouch |",
        "|---:|---:|---|---:|---:|---:|---:|",
    ]
    for tau_margin, depth_margin in margins:
        for correct in (True, False):
            for limit in limits:
                found = [
                    decide(r, tau_margin, depth_margin) for r in rows if r["correct"] is correct and r["limit"] == limit
                ]
                lines.append(
                    f"| {tau_margin:.0%} | {depth_margin} | {'correct' if correct else 'broken'} | {limit} | "
                    f"{found.count('pass')} | {found.count('fail')} | {found.count('skip')} |"
                )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if (
        argv and argv[0] == "--summarise"
    ):  # python scripts/aggregate_bands.py --summarise F.json ... [--margins 0.03,0.05 ...]
        files = [a for a in argv[1:] if not a.startswith("--") and "," not in a]
        pairs = [tuple(float(x) for x in a.split(",")) for a in argv[1:] if "," in a] or [(0.03, 0.05)]
        print(summarise(files, pairs))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", nargs="+", default=["bfloat16", "float16"])
    parser.add_argument("--limits", nargs="+", type=int, default=[7, 12, 20])
    parser.add_argument("--budgets", default="16,64")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--run-seed", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--only", nargs="*", default=None, help="engine labels (substrings) to run")
    parser.add_argument("--mutants", nargs="*", default=list(LOSSLESS_SLOWER), help="mutant labels (substrings)")
    parser.add_argument("--json", required=True, help="rows as JSON (rewritten after every engine)")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    engines = [(label, cls, True) for label, cls in ROUNDING_ENGINES.items()]
    engines += [(label, cls, False) for label, cls in MUTANTS.items() if any(m in label for m in args.mutants)]
    if args.only:
        engines = [e for e in engines if any(o in e[0] for o in args.only)]
    if not engines:
        parser.error("no engine matches --only/--mutants")
    rows: list[dict] = []
    for dtype in args.dtypes:
        for limit in args.limits:
            settings = SuiteSettings(
                model_dir=str(FIXTURE_TARGET),
                drafter_dir=str(FIXTURE_DRAFTER),
                prompt_set="fixture",
                pair_name="fixture",
                budgets=[int(b) for b in args.budgets.split(",")],
                limit=limit,
                max_new_tokens=args.max_new_tokens,
                isolate=False,
                dtype=dtype,
                device=args.device,
                run_seed=args.run_seed,
            )
            for label, cls, correct in engines:
                found = rows_for(label, cls, settings, correct)
                rows += found
                for r in found:
                    print(f"{label} {dtype} limit {limit} {r['check']}: {r['status']} {r['band_relative']}", flush=True)
                atomic_write(args.json, json.dumps(rows, indent=1))
    print(table(rows))
    wrong = [r for r in rows if r["correct"] and r["status"] != "pass"]
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
