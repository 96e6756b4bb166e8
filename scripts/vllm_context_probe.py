"""Where the vLLM plugin's drafter parts from the reference across the context window (fixture pair, fp32).

    python scripts/vllm_context_probe.py check [--budget 16] [--max-context N]
    python scripts/vllm_context_probe.py drafter [--budget 16] [--max-context N] [--last K]

Run in the vLLM tier's venv (``.ci/vllm-tier`` builds ``.venv-vllm``), with the tier's engine options
(one ``LLM`` shared by budgets up to 128, :data:`~ddtree_conformance.testing.tiers.VLLM_TIER_ENGINE_OPTIONS`)
and the plugin tier's run seed 1234 (:func:`~ddtree_conformance.testing.tiers.vllm_tier_settings`).
``check`` runs the context-range check alone and prints its verdict and the first differing rounds.
``drafter`` decodes the last ``K`` requests of the context plan (the window's end) alone with traces
and drafter logits, replays each round with the fp32 reference, and prints per round the root position
and the largest difference between the engine's drafter logits and the reference's: a fault of the
drafter at some context length shows as the row where that difference leaves float rounding (``1e-5``).
``drafter --max-context N`` plans the window as N tokens instead of the adapter's claim
(``capabilities().max_context``, which the check always uses); the claim is what this script found
(``adapters/vllm/engine.py::_max_context``): with ``--max-context 895`` (the claim before) the rows
part from root 880 at B=16.
"""

from __future__ import annotations

import argparse
import json

from ddtree_conformance.session import SuiteSession
from ddtree_conformance.testing.tiers import VLLM_PLUGIN_TIER_RUN_SEED, run_checks, vllm_tier_settings


def _session(budget: int) -> SuiteSession:
    settings = vllm_tier_settings(modes=["ddtree"], budgets=[budget], run_seed=VLLM_PLUGIN_TIER_RUN_SEED)
    return SuiteSession(settings)


def _check(session: SuiteSession) -> None:
    for cid, result in run_checks(session, ["context-range"])["results"].items():
        print(cid, result.status, result.message[:1500])
        for line in result.details.get("differing_rounds", [])[:10]:
            print("  ", line[:300])


def _drafter(session: SuiteSession, budget: int, window: int, last: int) -> None:
    import torch

    from ddtree_conformance.adapters.reference.replay import replay_result
    from ddtree_conformance.checks.context_range import context_requests

    _, requests, labels = context_requests(session, window)
    reference = session.engines.reference_for(session.settings.model_dir, session.settings.drafter_dir)
    for label, request in list(zip(labels, requests))[-last:]:
        traced = session.run("ddtree", budget, requests=[request], together=True, trace=True, trace_draft_logits=True)[
            0
        ]
        if traced.error:
            print(label, "error:", traced.error.splitlines()[0])
            continue
        rounds = replay_result(
            reference,
            request,
            traced.output_ids,
            traced.acceptance_lengths,
            "ddtree",
            budget,
            "cpu",
            keep_logits=lambda *_: True,
        )
        print(label)
        for trace, replayed in zip(traced.traces or [], rounds):
            mine = torch.as_tensor(trace.draft_logits).float() if trace.draft_logits is not None else None
            theirs = replayed.draft_logits
            gap = (
                "-"
                if mine is None or theirs is None or mine.shape != theirs.shape
                else (f"{(mine - theirs.float()).abs().max().item():.3g}")
            )
            print(
                f"  root {replayed.start}: lengths engine/replay {len(trace.accepted) + 1}/{replayed.length}, "
                f"drafter logits apart by {gap}"
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("check", "drafter"))
    parser.add_argument("--budget", type=int, default=16)
    parser.add_argument("--max-context", type=int, default=None, help="decode up to this window (default: the claim)")
    parser.add_argument("--last", type=int, default=2, help="drafter: how many requests at the window's end")
    args = parser.parse_args(argv)
    session = _session(args.budget)
    try:
        window = args.max_context or session.capabilities.max_context
        print(json.dumps({"max_context": session.capabilities.max_context, "window": window}))
        if args.what == "check":
            _check(session)
        else:
            _drafter(session, args.budget, window, args.last)
    finally:
        session.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
