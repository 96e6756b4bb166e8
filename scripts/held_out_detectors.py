#!/usr/bin/env python
"""How well the detectors an engine team would build from this repository tell the suite's prompts
from a user's, on the fixture pair (``docs/reference/run-inputs.md`` quotes this script's output).

Three kinds of "suite" prompts against prompts a user of the fixture pair writes (``scripts/
build_fixture.py``'s recipe with another seed):

* ``held-out``: the held-out prompts of the bundled fixture set (the templates, a run seed each);
* ``old recipe``: the held-out recipe before issue 32 (1-8 opening tokens of a bundled prompt, the
  target's samples, a bundled length);
* ``target samples``: what a user's own prompt set gets (the fp32 target's samples at temperature 1).

Each detector's AUC (0.5 is chance; for a yes/no detector, its balanced accuracy) and Mann-Whitney
p-value (two-sided), from ``ddtree_conformance.testing.prompt_detectors``.

    python scripts/held_out_detectors.py [--n 200] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import time

import torch


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200, help="prompts of each kind (users: as many)")
    parser.add_argument("--old", type=int, default=48, help="old-recipe prompts (sampled one token at a time)")
    parser.add_argument("--json", default=None, help="also write the table here")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)

    from tokenizers import Tokenizer

    from ddtree_conformance.held_out import TargetSource, prompt_source
    from ddtree_conformance.paths import FIXTURE_TARGET
    from ddtree_conformance.prompts import load_prompts
    from ddtree_conformance.scorer import shared_scorer
    from ddtree_conformance.settings import SuiteSettings
    from ddtree_conformance.testing.prompt_detectors import Scorer, compare, old_recipe_prompts, user_prompts
    from ddtree_conformance.token_scoring import target_logits

    started = time.perf_counter()
    tokenizer = Tokenizer.from_file(str(FIXTURE_TARGET / "tokenizer.json"))

    def encode(text: str) -> list[int]:
        return list(tokenizer.encode(text).ids)

    bundled = load_prompts("fixture")
    ids = [p.prompt_ids for p in bundled]
    scorer = Scorer(ids, target_logits(str(FIXTURE_TARGET), "cpu").fn)
    model = shared_scorer(str(FIXTURE_TARGET), "float32", "cpu").model
    n, half = args.n, args.n // 2
    users, train_users = user_prompts(2027, n // 4, encode), user_prompts(2028, half // 4, encode)
    templates = prompt_source(SuiteSettings(), bundled)
    sampled = TargetSource(str(FIXTURE_TARGET), "cpu", bundled)
    kinds = {
        "held-out": (
            [p.prompt_ids for s in range(n // 4) for p in templates.held_out(4, s)],
            [p.prompt_ids for s in range(1000, 1000 + half // 4) for p in templates.held_out(4, s)],
        ),
        "old recipe": (old_recipe_prompts(ids, model, args.old, 3), old_recipe_prompts(ids, model, args.old, 4)),
        "target samples": (
            [p.prompt_ids for s in range(n // 4) for p in sampled.held_out(4, s)],
            [p.prompt_ids for s in range(1000, 1000 + half // 4) for p in sampled.held_out(4, s)],
        ),
    }
    table: dict = {"users": len(users), "kinds": {}}
    for kind, (suite, train) in kinds.items():
        rows = compare(scorer, suite, users, train, train_users)
        table["kinds"][kind] = {"n": len(suite), "detectors": [r.__dict__ for r in rows]}
        print(f"{kind} (n={len(suite)}) vs users (n={len(users)}):")
        for r in rows:
            print(f"  {r.name:15s} AUC {r.auc:.3f}  p {r.p_value:.2g}  mean {r.suite_mean:.3f} vs {r.user_mean:.3f}")
    print(f"{time.perf_counter() - started:.0f} s")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(table, handle, indent=1)
    return table


if __name__ == "__main__":
    main()
