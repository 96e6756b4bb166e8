import sys, json, torch
torch.set_num_threads(1)
from ddtree_conformance.session import SuiteSettings
from ddtree_conformance.paths import FIXTURE_DRAFTER, FIXTURE_TARGET
from ddtree_conformance.testing.correct_engines import CORRECT_ENGINES
from ddtree_conformance.testing.rounding_engines import aggregate_box
from ddtree_conformance.testing.runs import plan_and_run
dtype = sys.argv[1]
s = SuiteSettings(model_dir=str(FIXTURE_TARGET), drafter_dir=str(FIXTURE_DRAFTER), prompt_set="fixture", pair_name="fixture",
    budgets=[16], limit=20, max_new_tokens=64, isolate=False, dtype=dtype, device="cpu", run_seed=1)
rows = []
for label, cls in CORRECT_ENGINES.items():
    try:
        rs = plan_and_run(s, aggregate_box(cls), ["acceptance/ddtree"])
        for r in rs:
            rows.append((label, r.check, r.status, r.message[:230]))
            print(label, "|", r.check, "|", r.status, "|", r.message[:230], flush=True)
    except Exception as e:
        print(label, "ERROR", type(e).__name__, str(e)[:200], flush=True)
json.dump(rows, open(f"/tmp/corr_agg_{dtype}.json", "w"), indent=1)
