"""Reference engine per-stage time per DDTree round against budget, vs one plain decode step.

    python scripts/bench_reference_stages.py --shape 8b --device cuda --dtype bfloat16 --out stages.json

An 8B-shaped Qwen3 target (hidden 4096, 36 layers, 32/8 heads of 128, vocab 151,936) and a
5-layer DFlash drafter of the z-lab b16 shape, random weights, built directly on the device.
Random weights accept almost nothing, which is what this measures: the cost of one round
(draft, build, compile, verify, walk, commit) at each budget, with the heap and the vectorized
builders, as a ratio to one plain decode step at the same context length. Numbers go in notes;
nothing here is a test.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ddtree_conformance.adapters.interface import Request, RunConfig  # noqa: E402
from ddtree_conformance.adapters.reference.dflash import DFlashConfig, DFlashDrafter, default_target_layer_ids  # noqa: E402
from ddtree_conformance.adapters.reference.engine import ReferenceEngine  # noqa: E402
from ddtree_conformance.testing.random_pair import drafter_config_dict  # noqa: E402

SHAPES = {
    "8b": dict(hidden=4096, inter=12288, layers=36, heads=32, kv=8, head_dim=128, vocab=151936, draft_layers=5),
    "tiny": dict(hidden=128, inter=384, layers=4, heads=4, kv=2, head_dim=32, vocab=4096, draft_layers=1),
}


def build(shape: dict, dtype: torch.dtype, device: str, root: Path):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(vocab_size=shape["vocab"], hidden_size=shape["hidden"], intermediate_size=shape["inter"],
                      num_hidden_layers=shape["layers"], num_attention_heads=shape["heads"],
                      num_key_value_heads=shape["kv"], head_dim=shape["head_dim"], max_position_embeddings=40960,
                      rope_theta=1e6, tie_word_embeddings=False)
    cfg.save_pretrained(root / "target")
    ids = default_target_layer_ids(shape["layers"], shape["draft_layers"])
    raw = drafter_config_dict(vocab_size=shape["vocab"], hidden_size=shape["hidden"], num_heads=shape["heads"],
                              head_dim=shape["head_dim"], num_layers=shape["draft_layers"],
                              num_target_layers=shape["layers"], target_layer_ids=ids,
                              mask_token_id=shape["vocab"] - 2, intermediate_size=shape["inter"])
    raw["num_key_value_heads"] = shape["kv"]
    (root / "drafter").mkdir(parents=True, exist_ok=True)
    (root / "drafter" / "config.json").write_text(json.dumps(raw))
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            target = Qwen3ForCausalLM(cfg).eval()
            drafter = DFlashDrafter(DFlashConfig.from_dict(raw)).eval()
    finally:
        torch.set_default_dtype(previous)
    return target, drafter


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="8b")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--budgets", type=int, nargs="+", default=[16, 32, 64, 128, 256, 512, 1024])
    parser.add_argument("--builders", nargs="+", default=["heap", "vectorized"])
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    dtype = getattr(torch, args.dtype)
    root = Path(tempfile.mkdtemp(prefix="bench-stages-"))
    target, drafter = build(SHAPES[args.shape], dtype, args.device, root)
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, SHAPES[args.shape]["vocab"] - 2, (args.prompt_len,), generator=g).tolist()
    request = Request(prompt_ids=prompt, max_new_tokens=args.new_tokens)
    rows = []

    def measure(engine, mode, budget):
        config = RunConfig(mode=mode, budget=budget, dtype=args.dtype, device=args.device, timing=True)
        engine.use_models(target, drafter, config)
        engine.generate([request], config)  # warm-up (kernels, allocator)
        per_round = []
        for _ in range(args.repeats):
            result = engine.generate([request], config)[0]
            per_round.append({k: v / result.rounds for k, v in result.timings.stages.items()})
        return {k: statistics.median(r[k] for r in per_round) for k in per_round[0]}

    reference = ReferenceEngine(str(root / "target"), str(root / "drafter"))
    plain = measure(reference, "plain", 1)
    plain_step = plain["verify"]
    print(f"plain decode step: {plain_step * 1e3:.2f} ms ({args.shape}, {args.dtype}, {args.device}, "
          f"context {args.prompt_len})")
    header = "builder     B     draft  build  compile verify  walk  commit | round ms  x plain step"
    print(header)
    for builder in args.builders:
        engine = ReferenceEngine(str(root / "target"), str(root / "drafter"), builder=builder)
        for budget in args.budgets:
            stages = measure(engine, "ddtree", budget)
            total = sum(stages.values())
            row = {"builder": builder, "budget": budget, **{k: v * 1e3 for k, v in stages.items()},
                   "round_ms": total * 1e3, "ratio_to_plain_step": total / plain_step}
            rows.append(row)
            print(f"{builder:10} {budget:5} " + " ".join(f"{stages.get(k, 0) * 1e3:6.2f}" for k in
                  ("draft", "build", "compile", "verify", "walk", "commit")) + f" | {total * 1e3:8.2f}  {row['ratio_to_plain_step']:6.2f}",
                  flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"plain_step_ms": plain_step * 1e3, "shape": args.shape,
                                              "dtype": args.dtype, "device": args.device,
                                              "torch": torch.__version__, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
