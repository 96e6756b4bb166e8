"""Recompute the A/B trials on record from their stored per-repeat samples under two look plans: looks up
to 60 (alpha / 8 each, as the trials ran) and looks cut at the row's own length (what re-planning within
the time budget gives). An estimate beside the trials, not new trials.

    python scripts/measurements/2026-12-05-issue29/reanalyse_looks.py
"""

from __future__ import annotations

import glob
import json
from collections import Counter

from ddtree_conformance.sequential import planned_looks, ratio_interval, verdict

ALPHA, EDGE = 0.05, 0.98
ALL = planned_looks(3, 60, 1.5)


def replay(samples: list[float], looks: list[int], level: float, ran_out: bool) -> str:
    for n in looks:
        found = verdict(ratio_interval(samples[:n], level), EDGE)
        if found:
            return "fail" if found == "regression" else found
    return "inconclusive" if ran_out else "undetermined (stopped earlier as recorded; later samples unknown)"


def main() -> None:
    files = sorted(glob.glob("scripts/measurements/2026-12-0[2-5]*/**/trials.jsonl", recursive=True))
    rows = [json.loads(line) for f in files for line in open(f)]
    rows = [r for r in rows if r.get("gate") == "ab" and r.get("samples") and r["stress"]]
    for name in ("looks to 60", "looks within the row's length"):
        counts: Counter = Counter()
        for r in rows:
            s, ran_out = r["samples"], r["verdict"] == "inconclusive"
            if name == "looks to 60":
                looks, k = [n for n in ALL if n <= len(s)] + ([len(s)] if ran_out else []), len(ALL)
            else:
                early = [n for n in ALL if n < len(s)]
                looks, k = early + ([len(s)] if ran_out else [n for n in ALL if n == len(s)]), len(early) + 1
            counts[(r["label"], replay(s, looks, ALPHA / k, ran_out))] += 1
        print(f"{name}: {len(rows)} stressed A/B rows with samples")
        for key, n in sorted(counts.items()):
            print(f"  {key[0]:10} {key[1]:12} {n}")


if __name__ == "__main__":
    main()
