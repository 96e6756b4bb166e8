"""Print the tree-policy and pitfall tables: each catalogued engine, the checks that judge it, the verdicts.

    python scripts/catalogue_tables.py [--limit 4] [--only policies|pitfalls] [--json F]

Tree policies (conformance/testing/tree_policies.py): lossless/ddtree, tree-structure/ddtree (traces)
and acceptance/ddtree of the same engine reporting counters only, as the PRs' engines do, on the
fixture pair (B = 8 for the chain at B <= L, 64 for SGLang's whole policy, 16 otherwise). A policy
engine must pass lossless and fail the other two naming its policy. Pitfalls
(conformance/testing/pitfalls.py): the check each one's class is caught by, on the pair it shows on.
Exits 1 when a policy engine fails lossless or passes DDTree conformance, or a pitfall engine passes.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from ddtree_conformance.files import atomic_write
from ddtree_conformance.paths import FIXTURE_DRAFTER, FIXTURE_TARGET
from ddtree_conformance.session import SuiteSettings
from ddtree_conformance.testing import pitfalls, tree_policies
from ddtree_conformance.testing.random_pair import write_random_pair
from ddtree_conformance.testing.runs import by_family, plan_and_run, random_pair_settings


def _cell(text: str, width: int = 400) -> str:
    return " ".join(text.split()).replace("|", "/")[:width]


def policy_rows(fixture: SuiteSettings) -> tuple[list[dict], list[str]]:
    rows, bad = [], []
    for label, (engine, kinds) in tree_policies.TREE_POLICY_ENGINES.items():
        budget = (
            8
            if engine is tree_policies.ChainAtOrBelowBlock
            else 64
            if engine is tree_policies.SglangPr29907Trees
            else 16
        )
        settings = fixture.model_copy(update={"budgets": [budget]})
        traced = by_family(plan_and_run(settings, engine, ["lossless/ddtree", "tree-structure/ddtree"]))
        (counters,) = plan_and_run(settings, tree_policies.counters_only(engine), ["acceptance/ddtree"])
        row = {
            "engine": label,
            "budget": budget,
            "lossless": traced["lossless"].status,
            "tree-structure": traced["tree-structure"].status,
            "tree-structure message": traced["tree-structure"].message,
            "acceptance (counters only)": counters.status,
            "acceptance message": counters.message,
            "expected": list(kinds),
        }
        rows.append(row)
        print(
            f"| {label} | B={budget} | {row['lossless']} | {row['tree-structure']}: "
            f"{_cell(row['tree-structure message'])} | {row['acceptance (counters only)']}: "
            f"{_cell(row['acceptance message'])} |",
            flush=True,
        )
        if row["lossless"] != "pass" or row["tree-structure"] != "fail":
            bad.append(label)
    return rows, bad


def pitfall_rows(fixture: SuiteSettings, random: SuiteSettings) -> tuple[list[dict], list[str]]:
    pairs = {"fixture": fixture, "random": random, "random-tp2": random.model_copy(update={"tensor_parallel_size": 2})}
    rows, bad = [], []
    for label, (engine, check, pair) in pitfalls.PITFALLS.items():
        (result,) = plan_and_run(pairs[pair], engine, [check])
        rows.append(
            {
                "pitfall": label,
                "engine": engine.__name__,
                "check": check,
                "pair": pair,
                "status": result.status,
                "message": result.message,
            }
        )
        print(
            f"| {label} | {check} ({pair}) | {engine.__name__} | {result.status}: {_cell(result.message)} |", flush=True
        )
        if result.status != "fail":
            bad.append(label)
    return rows, bad


def main(argv: list[str] | None = None) -> int:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=4, help="fixture prompts")
    parser.add_argument("--only", choices=("policies", "pitfalls"), default=None)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    fixture = SuiteSettings(
        model_dir=str(FIXTURE_TARGET),
        drafter_dir=str(FIXTURE_DRAFTER),
        pair_name="fixture",
        prompt_set="fixture",
        limit=args.limit,
        max_new_tokens=32,
        budgets=[16],
        isolate=False,
        held_out_prompts=0,
        run_seed=1,
        golden_dir="/nonexistent",
    )
    out: dict = {}
    bad: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        target, drafter = write_random_pair(Path(tmp))
        prompts = Path(tmp) / "prompts.jsonl"
        random = random_pair_settings(
            (target, drafter),
            prompts,
            [3, 9, 17, 30],
            seed=5,
            prefix="m",
            budgets=[16],
            max_new_tokens=24,
            held_out_prompts=0,
            run_seed=1,
        )
        if args.only in (None, "policies"):
            print("| policy engine | budget | lossless | tree-structure (traces) | acceptance (counters only) |")
            print("|---|---|---|---|---|")
            out["policies"], failed = policy_rows(fixture)
            bad += failed
        if args.only in (None, "pitfalls"):
            print("\n| pitfall class | check (pair) | broken engine | verdict and message |")
            print("|---|---|---|---|")
            out["pitfalls"], failed = pitfall_rows(fixture.model_copy(update={"limit": 3}), random)
            bad += failed
    if args.json:
        atomic_write(args.json, json.dumps(out, indent=1) + "\n")
    if bad:
        print("NOT AS EXPECTED:", ", ".join(bad))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
