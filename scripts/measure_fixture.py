#!/usr/bin/env python
"""Measure the bundled fixture pair against its done-when bars, per prompt category.

Runs the reference engine at T=0 (fp32 by default, no stop tokens, a fixed number of new tokens)
in plain, DFlash and DDTree modes over every prompt of ``golden/prompts/fixture.jsonl`` and
reports, per category:

* ``distinct``: median share of distinct token ids in a plain (greedy) output;
* ``tau``: mean acceptance length (generated tokens / rounds, bonus included), averaged over
  responses (the paper's per-response mean), for DFlash and DDTree at each budget;
* ``(pooled)``: DFlash tau with all rounds pooled, ``1 + accepted / rounds`` (how vLLM reports it);
* ``ratio@B``: DDTree tau / DFlash tau;
* ``lossless``: how many DFlash / DDTree outputs equal the plain output token for token;
* ``gap``: the target's top-1 minus top-2 logit at every greedy output position (min, 1st
  percentile, median, share >= 1e-3), from one teacher-forced forward over prompt + output.

    python scripts/measure_fixture.py --json reports/fixture_measure.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from ddtree_conformance.adapters.interface import Request, RunConfig  # noqa: E402
from ddtree_conformance.adapters.reference.engine import ReferenceEngine  # noqa: E402

GAP_BAR = 1e-3


def load_prompts(path: Path, limit: int | None) -> list[dict]:
    prompts = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if limit is not None:
        counts: dict[str, int] = {}
        kept = []
        for p in prompts:
            if counts.get(p["category"], 0) < limit:
                kept.append(p)
                counts[p["category"]] = counts.get(p["category"], 0) + 1
        prompts = kept
    return prompts


@torch.no_grad()
def top2_gaps(target, prompt_ids: list[int], output_ids: list[int], device: str) -> list[float]:
    """Top-1 minus top-2 target logit at the position that produced each output token."""
    ids = torch.tensor([prompt_ids + output_ids[:-1]], device=device)
    logits = target(input_ids=ids).logits[0, len(prompt_ids) - 1 :].float()
    top = torch.topk(logits, 2, dim=-1).values
    return (top[:, 0] - top[:, 1]).tolist()


def measure(args) -> dict:
    fixture = Path(args.fixture)
    target_dir, drafter_dir = fixture / "target", fixture / "drafter"
    prompts = load_prompts(Path(args.prompts), args.limit)
    categories = sorted({p["category"] for p in prompts}, key=[p["category"] for p in prompts].index)
    engine = ReferenceEngine(str(target_dir), str(drafter_dir))
    requests = [Request(prompt_ids=p["prompt_ids"], max_new_tokens=args.max_new_tokens) for p in prompts]
    runs: dict[str, list] = {}
    modes = [("plain", RunConfig(mode="plain", dtype=args.dtype, device=args.device))]
    modes.append(("dflash", RunConfig(mode="dflash", dtype=args.dtype, device=args.device)))
    for b in args.budgets:
        modes.append((f"ddtree@{b}", RunConfig(mode="ddtree", budget=b, dtype=args.dtype, device=args.device)))
    for name, config in modes:
        t0 = time.time()
        results = engine.generate(requests, config)
        errors = [r.error for r in results if r.error]
        if errors:
            raise SystemExit(f"{name}: engine error: {errors[0]}")
        runs[name] = results
        print(f"  ran {name:>11} on {len(requests)} prompts in {time.time() - t0:6.1f} s", file=sys.stderr, flush=True)

    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=torch.float32).to(args.device).eval()
    gaps = [top2_gaps(target, p["prompt_ids"], r.output_ids, args.device) for p, r in zip(prompts, runs["plain"])]

    report: dict = {
        "fixture": str(fixture),
        "prompts": args.prompts,
        "settings": {
            "temperature": 0.0,
            "dtype": args.dtype,
            "device": args.device,
            "max_new_tokens": args.max_new_tokens,
            "stop_tokens": [],
            "budgets": args.budgets,
            "tau": "per-response mean of acceptance lengths (bonus included), averaged over responses; "
            "tau_aggregate_*: all acceptance lengths pooled (= 1 + accepted / rounds)",
        },
        "categories": {},
    }
    spec_modes = [m for m, _ in modes if m != "plain"]
    for cat in [*categories, "all"]:
        idx = [i for i, p in enumerate(prompts) if cat == "all" or p["category"] == cat]
        plain = [runs["plain"][i].output_ids for i in idx]
        row: dict = {"prompts": len(idx)}
        row["distinct_median"] = statistics.median(len(set(o)) / len(o) for o in plain)
        row["distinct_min"] = min(len(set(o)) / len(o) for o in plain)
        for m in spec_modes:
            row[f"tau_{m}"] = float(np.mean([runs[m][i].tau for i in idx]))
            lengths = [a for i in idx for a in runs[m][i].acceptance_lengths]
            row[f"tau_aggregate_{m}"] = sum(lengths) / len(lengths)  # 1 + accepted / rounds, vLLM's form
            if m == "dflash":
                row["dflash_rounds"], row["dflash_accepted"] = len(lengths), sum(a - 1 for a in lengths)
                row["dflash_accepted_per_position"] = [sum(a - 1 >= d for a in lengths) for d in range(1, 16)]
            row[f"lossless_{m}"] = sum(runs[m][i].output_ids == runs["plain"][i].output_ids for i in idx)
        for b in args.budgets:
            row[f"ratio@{b}"] = row[f"tau_ddtree@{b}"] / row["tau_dflash"]
        g = np.array([x for i in idx for x in gaps[i]])
        row["gap"] = {
            "min": float(g.min()),
            "p1": float(np.percentile(g, 1)),
            "median": float(np.median(g)),
            "share_ge_1e-3": float((g >= GAP_BAR).mean()),
            "positions": int(g.size),
        }
        report["categories"][cat] = row

    allrow = report["categories"]["all"]
    cat_rows = [report["categories"][c] for c in categories]
    taus_by_budget = [allrow[f"tau_ddtree@{b}"] for b in args.budgets]
    bars = {
        "distinct_median>=0.3 per category": all(r["distinct_median"] >= 0.3 for r in cat_rows),
        "dflash_tau>=2.5 (all prompts)": allrow["tau_dflash"] >= 2.5,
        "ddtree@32>=1.3x dflash (all prompts)": 32 not in args.budgets or allrow["ratio@32"] >= 1.3,
        "ddtree@256>=1.5x dflash (all prompts)": 256 not in args.budgets or allrow["ratio@256"] >= 1.5,
        "ddtree tau rises with budget (all prompts)": all(a < b for a, b in zip(taus_by_budget, taus_by_budget[1:])),
        "some category ddtree@256 tau>=5": 256 not in args.budgets or any(r["tau_ddtree@256"] >= 5 for r in cat_rows),
        "top2 gap>=1e-3 at >=99% of positions (all prompts)": allrow["gap"]["share_ge_1e-3"] >= 0.99,
        "lossless (all modes equal plain)": all(allrow[f"lossless_{m}"] == allrow["prompts"] for m in spec_modes),
    }
    report["bars"] = bars
    return report


def print_table(report: dict, budgets: list[int]) -> None:
    cols = ["category", "n", "distinct", "dflash", "(pooled)"]
    cols += [f"dd@{b}" for b in budgets] + [f"x@{b}" for b in budgets]
    cols += ["lossless", "gap min", "gap p1", "gap med", "gap>=1e-3"]
    rows = []
    for cat, r in report["categories"].items():
        spec = [k for k in r if k.startswith("lossless_")]
        rows.append(
            [
                cat,
                str(r["prompts"]),
                f"{r['distinct_median']:.2f}",
                f"{r['tau_dflash']:.2f}",
                f"{r['tau_aggregate_dflash']:.2f}",
                *[f"{r[f'tau_ddtree@{b}']:.2f}" for b in budgets],
                *[f"{r[f'ratio@{b}']:.2f}" for b in budgets],
                f"{min(r[k] for k in spec)}/{r['prompts']}",
                f"{r['gap']['min']:.2e}",
                f"{r['gap']['p1']:.3f}",
                f"{r['gap']['median']:.2f}",
                f"{100 * r['gap']['share_ge_1e-3']:.2f}%",
            ]
        )
    widths = [max(len(c), *(len(row[i]) for row in rows)) for i, c in enumerate(cols)]
    print("  ".join(c.rjust(w) for c, w in zip(cols, widths)))
    for row in rows:
        print("  ".join(v.rjust(w) for v, w in zip(row, widths)))
    print()
    for bar, ok in report["bars"].items():
        print(f"  [{'PASS' if ok else 'FAIL'}] {bar}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fixture", default=str(ROOT / "golden" / "fixture"))
    ap.add_argument("--prompts", default=str(ROOT / "golden" / "prompts" / "fixture.jsonl"))
    ap.add_argument("--budgets", type=int, nargs="+", default=[16, 32, 64, 128, 256])
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--limit", type=int, default=None, help="prompts per category (default: all)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", default=None, help="write the report here")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    report = measure(args)
    print_table(report, args.budgets)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0 if all(report["bars"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
