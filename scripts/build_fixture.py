#!/usr/bin/env python
"""Rebuild the bundled fixture pair from scratch: corpus, tokenizer, Qwen3 target, DFlash drafter.

Everything is generated here from a seed; nothing is downloaded.

1. Corpus: four kinds of synthetic documents written by the templates of
   ``ddtree_conformance.fixture_text`` (all word lists are this project's own): ``chat`` (templated
   dialogue, many free slots -> high entropy), ``code`` (Python-like classes and functions whose
   bodies repeat their signatures), ``math`` (times tables, counting, word problems) and ``records``
   (JSON / CSV lines with derived fields). The suite draws held-out prompts from the same templates.
2. Tokenizer: byte-level BPE trained with ``tokenizers`` on that corpus, with ``<|endoftext|>``
   (the eos) and ``<|MASK|>`` (the drafter's mask token, last id).
3. Target: a small ``Qwen3ForCausalLM`` trained from scratch on the corpus (next-token loss).
4. Drafter: a DFlash drafter (z-lab format, block size 16) distilled on the target's own greedy and
   sampled continuations of corpus prefixes: random anchor ``a`` in the continuation, context =
   target features of positions ``0..a-1``, block ``[tok_a, MASK x 15]``, labels ``a+1..a+15``.
5. Prompts: a separate random stream writes held-out prompts per category (checked against the
   training corpus) to ``<out>/prompts/fixture.jsonl``.

Only torch, transformers, tokenizers, safetensors and numpy are needed (plus this repository's
``ddtree_conformance.adapters.reference.dflash``, ``ddtree_conformance.spec.tree`` and
``ddtree_conformance.fixture_text``), so it runs on a bare GPU box too.
CPU runs are bit-for-bit repeatable for a given seed and torch version; CUDA runs are seeded but
not bitwise repeatable (atomic adds in backward passes).

    python scripts/build_fixture.py --out golden --device cuda          # the committed recipe
    python scripts/build_fixture.py --out /tmp/fx --quick               # small slice, seconds
    python scripts/build_fixture.py --out golden --target-from golden/fixture/target \
        --drafter-steps 300                                             # redo only the drafter

The drafter is deliberately not trained to convergence: 300 steps give DFlash acceptance
lengths near those of real b16 drafters (about 3 on chat, 6 on code and math) and leave the
drafter uncertain enough that a tree pays off (DDTree/DFlash about 1.3x at B=32, 1.7x at B=256).
A 2000-step drafter accepts almost everything on code (tau near 16) and the tree gains little.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import platform
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from ddtree_conformance import fixture_text  # noqa: E402  (the templates: the held-out prompts' source too)
from ddtree_conformance.adapters.reference.dflash import DFlashConfig, DFlashDrafter, save_drafter  # noqa: E402

CATEGORIES, GENERATORS, prompt_cuts = fixture_text.CATEGORIES, fixture_text.GENERATORS, fixture_text.prompt_cuts
PROMPT_MIN_TOKENS, PROMPT_MAX_TOKENS = fixture_text.PROMPT_MIN_TOKENS, fixture_text.PROMPT_MAX_TOKENS

EOS = "<|endoftext|>"
MASK = "<|MASK|>"
BLOCK_SIZE = 16
PROMPT_STREAM = 7_919  # prompts use Random(seed * 1_000_003 + PROMPT_STREAM): a separate stream
__all__ = ["CATEGORIES", "GENERATORS", "PROMPT_MIN_TOKENS", "PROMPT_MAX_TOKENS", "make_corpus", "make_prompts", "build"]


# --------------------------------------------------------------------------------------------
# Corpus: documents from the templates of ddtree_conformance.fixture_text
# --------------------------------------------------------------------------------------------


def make_corpus(seed: int, docs_per_category: int) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    docs = [(cat, GENERATORS[cat](rng)) for _ in range(docs_per_category) for cat in CATEGORIES]
    rng.shuffle(docs)
    return docs


# --------------------------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------------------------


def train_tokenizer(texts: list[str], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - 1,  # the mask token is appended after training (last id)
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    tok.add_special_tokens([MASK])
    return tok


def save_tokenizer_files(tok, out: Path, max_len: int) -> None:
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "eos_token": EOS,
                "pad_token": EOS,
                "additional_special_tokens": [MASK],
                "model_max_length": max_len,
                "clean_up_tokenization_spaces": False,
                "add_bos_token": False,
                "add_eos_token": False,
            },
            indent=2,
        )
        + "\n"
    )
    (out / "special_tokens_map.json").write_text(
        json.dumps({"eos_token": EOS, "pad_token": EOS, "additional_special_tokens": [MASK]}, indent=2) + "\n"
    )


# --------------------------------------------------------------------------------------------
# Prompts (held out)
# --------------------------------------------------------------------------------------------


def make_prompts(seed: int, tok, per_category: int, corpus_text: str) -> list[dict]:
    rng = random.Random(seed * 1_000_003 + PROMPT_STREAM)
    prompts = []
    for cat in CATEGORIES:
        made, seen = 0, set()
        while made < per_category:
            doc = GENERATORS[cat](rng)
            cuts = prompt_cuts(cat, doc, lambda text: tok.encode(text).ids)
            if not cuts:
                continue
            text, pids = rng.choice(cuts)
            if text in seen or text in corpus_text:
                continue  # held out: the prompt text never occurs in the training corpus
            seen.add(text)
            prompts.append({"id": f"{cat}-{made:02d}", "category": cat, "text": text, "prompt_ids": pids})
            made += 1
    return prompts


# --------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------


@dataclass
class Sizes:
    hidden: int = 192
    heads: int = 6
    head_dim: int = 32
    intermediate: int = 512
    target_layers: int = 4
    draft_layers: int = 2
    draft_intermediate: int = 512
    vocab: int = 3072
    max_positions: int = 1024
    rope_theta: float = 10000.0


def target_layer_ids(num_layers: int) -> list[int]:
    """Spread over the target, never the last layer: [0, L-2] (or [0] for tiny targets)."""
    return [0, num_layers - 2] if num_layers > 2 else [0]


def make_target(sizes: Sizes, vocab: int, eos_id: int):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(
        vocab_size=vocab,
        hidden_size=sizes.hidden,
        intermediate_size=sizes.intermediate,
        num_hidden_layers=sizes.target_layers,
        num_attention_heads=sizes.heads,
        num_key_value_heads=sizes.heads,
        head_dim=sizes.head_dim,
        max_position_embeddings=sizes.max_positions,
        rope_theta=sizes.rope_theta,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
        attn_implementation="sdpa",
    )
    return Qwen3ForCausalLM(cfg)


def make_drafter(sizes: Sizes, vocab: int, mask_id: int) -> DFlashDrafter:
    from ddtree_conformance.drafter_config import drafter_config_dict

    raw = drafter_config_dict(
        vocab_size=vocab,
        hidden_size=sizes.hidden,
        num_heads=sizes.heads,
        head_dim=sizes.head_dim,
        num_layers=sizes.draft_layers,
        num_target_layers=sizes.target_layers,
        target_layer_ids=target_layer_ids(sizes.target_layers),
        mask_token_id=mask_id,
        block_size=BLOCK_SIZE,
        intermediate_size=sizes.draft_intermediate,
        rope_theta=sizes.rope_theta,
        max_position_embeddings=sizes.max_positions,
    )
    return DFlashDrafter(DFlashConfig.from_dict(raw))


def lr_at(step: int, total: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


class _TF32:
    """TF32 matmuls for training steps on CUDA only; generation and estimates stay full fp32."""

    def __init__(self, on: bool) -> None:
        self.on = on

    def __enter__(self):
        self.prev = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = self.on

    def __exit__(self, *exc):
        torch.backends.cuda.matmul.allow_tf32 = self.prev


def train_target(model, stream: np.ndarray, starts: np.ndarray, *, steps, batch, seq_len, lr, device, gen):
    model.to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    stream_t = torch.from_numpy(stream).to(device)
    offsets = torch.arange(seq_len + 1, device=device)
    valid = torch.from_numpy(starts[starts + seq_len + 1 <= len(stream)]).to(device)
    losses = []
    for step in range(steps):
        pick = valid[torch.randint(len(valid), (batch,), generator=gen).to(device)]
        window = stream_t[pick[:, None] + offsets]
        logits = model(input_ids=window[:, :-1]).logits
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), window[:, 1:].reshape(-1))
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, lr, max(1, steps // 20))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if step % max(1, steps // 10) == 0 or step == steps - 1:
            log(f"target step {step}/{steps} loss {loss.item():.4f}")
    model.eval()
    return losses


class FeatureTap:
    """Forward hooks on the target's selected decoder layers, as the reference engine uses."""

    def __init__(self, target, layer_ids: list[int]) -> None:
        self.layer_ids = layer_ids
        self.store: dict[int, torch.Tensor] = {}
        self.handles = [target.model.layers[i].register_forward_hook(self._hook(i)) for i in layer_ids]

    def _hook(self, layer_id):
        def hook(_module, _inputs, output):
            self.store[layer_id] = output[0] if isinstance(output, tuple) else output

        return hook

    def features(self) -> torch.Tensor:
        return torch.cat([self.store[i] for i in self.layer_ids], dim=-1)

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


@torch.no_grad()
def continue_batch(target, prefix: torch.Tensor, new_tokens: int, temperature: float, gen) -> torch.Tensor:
    """Target continuation of equal-length prefixes (greedy when temperature == 0), no stopping."""
    from transformers import DynamicCache

    cache = DynamicCache(config=target.config)
    out = target(input_ids=prefix, past_key_values=cache, use_cache=True)
    tokens = []
    for i in range(new_tokens):
        logits = out.logits[:, -1].float()
        if temperature == 0:
            nxt = logits.argmax(-1)
        else:
            probs = torch.softmax(logits / temperature, dim=-1)
            nxt = torch.multinomial(probs, 1, generator=gen).squeeze(1)
        tokens.append(nxt)
        if i + 1 < new_tokens:
            out = target(input_ids=nxt[:, None], past_key_values=cache, use_cache=True)
    return torch.cat([prefix, torch.stack(tokens, 1)], dim=1)


def distill_data(target, docs_ids: list[list[int]], *, groups, group_size, new_tokens, max_prefix, device, gen, rng):
    """Groups of equal-shape sequences: corpus prefix (same length within a group) + target continuation."""
    data = []
    long_docs = [d for d in docs_ids if len(d) >= 16]
    for g in range(groups):
        p = rng.randint(8, max_prefix)
        pool = [d for d in long_docs if len(d) >= p] or long_docs
        if len(pool[0]) < p:
            p = min(len(d) for d in pool)
        rows = [pool[rng.randrange(len(pool))][:p] for _ in range(group_size)]
        prefix = torch.tensor(rows, dtype=torch.long, device=device)
        temperature = 0.0 if g % 2 == 0 else 1.0
        seqs = continue_batch(target, prefix, new_tokens, temperature, gen)
        data.append((p, seqs))
    return data


def train_drafter(drafter, target, data, *, steps, batch, anchors_per_step, lr, device, gen, rng, decay=8.0):
    drafter.to(device).train()
    for p in target.parameters():
        p.requires_grad_(False)
    tap = FeatureTap(target, drafter.config.target_layer_ids)
    embed, head = target.get_input_embeddings(), target.get_output_embeddings()
    mask_id, size = drafter.config.mask_token_id, drafter.block_size
    weights = torch.exp(-torch.arange(size - 1, device=device, dtype=torch.float32) / decay)
    weights = weights / weights.sum()
    opt = torch.optim.AdamW(drafter.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.01)
    losses, accs = [], []
    for step in range(steps):
        p, seqs = data[rng.randrange(len(data))]
        rows = seqs[torch.randint(seqs.shape[0], (min(batch, seqs.shape[0]),), generator=gen).to(device)]
        with torch.no_grad():
            target(input_ids=rows)
            feats = tap.features()
        total_len = rows.shape[1]
        loss_sum, acc_sum = 0.0, 0.0
        for lr_group in opt.param_groups:
            lr_group["lr"] = lr_at(step, steps, lr, max(1, steps // 20))
        opt.zero_grad(set_to_none=True)
        for _ in range(anchors_per_step):
            a = rng.randint(p, total_len - size)  # root position; labels a+1 .. a+15 are target tokens
            block = torch.full((rows.shape[0], size), mask_id, dtype=torch.long, device=device)
            block[:, 0] = rows[:, a]
            with torch.no_grad():
                block_embeds = embed(block)
            positions = torch.arange(0, a + size, device=device).unsqueeze(0).expand(rows.shape[0], -1)
            hidden = drafter(block_embeds, feats[:, :a], positions)
            logits = head(hidden[:, 1:]).float()
            labels = rows[:, a + 1 : a + size]
            ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="none")
            loss = (ce.view(labels.shape) * weights).sum(-1).mean()
            (loss / anchors_per_step).backward()
            loss_sum += loss.item()
            acc_sum += (logits.argmax(-1) == labels).float().mean().item()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        opt.step()
        losses.append(loss_sum / anchors_per_step)
        accs.append(acc_sum / anchors_per_step)
        if step % max(1, steps // 10) == 0 or step == steps - 1:
            log(f"drafter step {step}/{steps} loss {losses[-1]:.4f} token-acc {accs[-1]:.3f}")
    tap.remove()
    drafter.eval()
    return losses, accs


# --------------------------------------------------------------------------------------------
# Quick acceptance estimate (teacher-forced simulation of T=0 DFlash / DDTree rounds)
# --------------------------------------------------------------------------------------------


@torch.no_grad()
def estimate_acceptance(target, drafter, prompts, *, device, new_tokens=64, budgets=(32, 256)):
    """At T=0 every lossless method emits the target's greedy output; simulate its rounds.

    Round: root at position r, drafter context = target features of 0..r-1; the accepted depth is
    the longest tree path matching the greedy continuation. Per-response tau, averaged.
    """
    from ddtree_conformance.spec.tree import build_chain, build_tree

    tap = FeatureTap(target, drafter.config.target_layer_ids)
    embed, head = target.get_input_embeddings(), target.get_output_embeddings()
    size, mask_id = drafter.block_size, drafter.config.mask_token_id
    out: dict[str, dict[str, list[float]]] = {}
    for prompt in prompts:
        ids = torch.tensor([prompt["prompt_ids"]], device=device)
        seq = continue_batch(target, ids, new_tokens + size, 0.0, None)[0]
        target(input_ids=seq[None])
        feats = tap.features()[0]
        plen = ids.shape[1]
        cont = seq[plen : plen + new_tokens]
        row = out.setdefault(prompt["category"], {})
        row.setdefault("distinct", []).append(len(set(cont.tolist())) / new_tokens)
        for mode in ["dflash", *[f"ddtree{b}" for b in budgets]]:
            r, emitted, lengths = plen, 1, []
            while emitted < new_tokens:
                block = torch.full((1, size), mask_id, dtype=torch.long, device=device)
                block[0, 0] = seq[r]
                pos = torch.arange(0, r + size, device=device)[None]
                logits = head(drafter(embed(block), feats[None, :r], pos)[0, 1:])
                tree = build_chain(logits) if mode == "dflash" else build_tree(logits, int(mode[6:]))
                children = tree.children
                node, depth = 0, 0
                while True:
                    nxt = children[node].get(int(seq[r + depth + 1]))
                    if nxt is None:
                        break
                    node, depth = nxt, depth + 1
                lengths.append(depth + 1)
                r += depth + 1
                emitted += depth + 1
            row.setdefault(mode, []).append(sum(lengths) / len(lengths))
    tap.remove()
    return {cat: {k: round(float(np.mean(v)), 3) for k, v in row.items()} for cat, row in out.items()}


# --------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def build(args) -> dict:
    t_start = time.time()
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    gen = torch.Generator(device="cpu").manual_seed(args.seed)
    out = Path(args.out)
    fixture, target_dir, drafter_dir = out / "fixture", out / "fixture" / "target", out / "fixture" / "drafter"
    prompts_path = out / "prompts" / "fixture.jsonl"
    for d in (target_dir, drafter_dir, prompts_path.parent):
        d.mkdir(parents=True, exist_ok=True)
    sizes = Sizes(vocab=args.vocab_size, draft_layers=args.draft_layers)

    log(f"corpus: {args.docs_per_category} docs per category, seed {args.seed}")
    docs = make_corpus(args.seed, args.docs_per_category)
    texts = [t for _, t in docs]
    corpus_text = "\x00".join(texts)

    if args.target_from:
        from tokenizers import Tokenizer

        log(f"tokenizer and target: reused from {args.target_from}")
        tok = Tokenizer.from_file(str(Path(args.target_from) / "tokenizer.json"))
    else:
        log(f"tokenizer: byte-level BPE, vocab {args.vocab_size}")
        tok = train_tokenizer(texts, args.vocab_size)
    vocab = tok.get_vocab_size()
    eos_id, mask_id = tok.token_to_id(EOS), tok.token_to_id(MASK)
    assert mask_id == vocab - 1, (mask_id, vocab)
    docs_ids = [e.ids for e in tok.encode_batch(texts)]
    stream, starts, pos = [], [], 0
    for ids in docs_ids:
        starts.append(pos)
        stream.extend(ids)
        stream.append(eos_id)
        pos += len(ids) + 1
    stream_np, starts_np = np.asarray(stream, dtype=np.int64), np.asarray(starts, dtype=np.int64)
    lengths = {c: [] for c in CATEGORIES}
    for (cat, _), ids in zip(docs, docs_ids):
        lengths[cat].append(len(ids))
    means = ", ".join(f"{c} {np.mean(v):.0f}" for c, v in lengths.items())
    log(f"corpus tokens {len(stream)}; mean doc tokens {means}")

    log("prompts: held-out stream")
    prompts = make_prompts(args.seed, tok, args.prompts_per_category, corpus_text)
    with open(prompts_path, "w") as f:
        for p in prompts:
            f.write(json.dumps(p) + "\n")

    target_info = None
    if args.target_from:
        from transformers import Qwen3ForCausalLM

        target = Qwen3ForCausalLM.from_pretrained(args.target_from, dtype=torch.float32, attn_implementation="sdpa")
        target.to(device).eval()
        n_target = sum(p.numel() for p in target.parameters())
        source_manifest = Path(args.target_from).parent / "MANIFEST.json"
        if source_manifest.is_file():
            old = json.loads(source_manifest.read_text())
            target_info = {
                **old["target"],
                "built_by_command": old.get("command"),
                "built_on": old.get("device_name"),
                "versions": old.get("versions"),
            }
        target_losses, t_target = [float("nan")], 0.0
    else:
        torch.manual_seed(args.seed)
        target = make_target(sizes, vocab, eos_id)
        n_target = sum(p.numel() for p in target.parameters())
        log(f"target: {n_target} params; training {args.target_steps} steps on {device}")
        t0 = time.time()
        with _TF32(args.tf32 and device.type == "cuda"):
            target_losses = train_target(
                target,
                stream_np,
                starts_np,
                steps=args.target_steps,
                batch=args.target_batch,
                seq_len=args.seq_len,
                lr=args.target_lr,
                device=device,
                gen=gen,
            )
        t_target = time.time() - t0

    # The drafter stage is reseeded on its own, so reusing a target (--target-from) gives the same
    # drafter as a from-scratch run that produced that target (on the same device).
    rng = random.Random(args.seed + 1)
    torch.manual_seed(args.seed + 1)
    gen = torch.Generator(device="cpu").manual_seed(args.seed + 1)
    log(f"distillation data: {args.distill_groups} groups x {args.distill_group_size} continuations")
    t0 = time.time()
    data = distill_data(
        target,
        docs_ids,
        groups=args.distill_groups,
        group_size=args.distill_group_size,
        new_tokens=args.distill_new_tokens,
        max_prefix=args.distill_max_prefix,
        device=device,
        gen=None,
        rng=rng,
    )
    t_data = time.time() - t0

    torch.manual_seed(args.seed + 2)
    drafter = make_drafter(sizes, vocab, mask_id)
    n_drafter = sum(p.numel() for n, p in drafter.named_parameters())
    log(f"drafter: {n_drafter} params; training {args.drafter_steps} steps")
    t0 = time.time()
    with _TF32(args.tf32 and device.type == "cuda"):
        drafter_losses, drafter_accs = train_drafter(
            drafter,
            target,
            data,
            steps=args.drafter_steps,
            batch=args.drafter_batch,
            anchors_per_step=args.anchors_per_step,
            lr=args.drafter_lr,
            device=device,
            gen=gen,
            rng=rng,
        )
    t_drafter = time.time() - t0

    target = target.to("cpu").float()
    if args.target_from and Path(args.target_from).resolve() != target_dir.resolve():
        import shutil

        for f in Path(args.target_from).iterdir():
            shutil.copy2(f, target_dir / f.name)
    target.generation_config.eos_token_id = eos_id
    target.generation_config.pad_token_id = eos_id
    target.generation_config.bos_token_id = None
    target.generation_config.do_sample = False
    if not args.target_from:
        target.save_pretrained(target_dir, safe_serialization=True)
        save_tokenizer_files(tok, target_dir, sizes.max_positions)
    drafter = drafter.to("cpu").float()
    save_drafter(drafter, drafter_dir)

    estimate = None
    if args.estimate:
        log("acceptance estimate (teacher-forced simulation) on the held-out prompts")
        target.to(device)
        drafter.to(device)
        subset = [p for p in prompts if int(p["id"].rsplit("-", 1)[1]) < args.estimate_prompts]
        estimate = estimate_acceptance(target, drafter, subset, device=device)
        estimate["prompts_per_category"] = args.estimate_prompts
        for cat, row in list(estimate.items())[:-1]:
            log(f"  {cat}: {row}")

    files = {
        str(p.relative_to(fixture)): {"bytes": p.stat().st_size, "sha256": sha256(p)}
        for p in sorted(list(target_dir.iterdir()) + list(drafter_dir.iterdir()))
        if p.is_file()
    }
    import tokenizers
    import transformers

    manifest = {
        "what": "DDTree conformance fixture pair: tiny Qwen3 target + DFlash drafter (z-lab format), trained here",
        "built_by": "scripts/build_fixture.py",
        "command": "python scripts/build_fixture.py " + " ".join(args.argv),
        "seed": args.seed,
        "quick": args.quick,
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__,
        },
        "tf32_training": bool(args.tf32 and device.type == "cuda"),
        "repeatability": (
            "CPU builds are bitwise repeatable per seed and torch version; CUDA builds are seeded, not bitwise"
        ),
        "corpus": {
            "categories": list(CATEGORIES),
            "docs_per_category": args.docs_per_category,
            "total_tokens": int(len(stream)),
            "mean_doc_tokens": {c: round(float(np.mean(v)), 1) for c, v in lengths.items()},
            "source": "generated by templates in scripts/build_fixture.py from the seed; no downloads",
        },
        "tokenizer": {
            "type": "byte-level BPE (tokenizers)",
            "vocab_size": vocab,
            "eos": [EOS, eos_id],
            "mask": [MASK, mask_id],
        },
        "target": {
            "architecture": "Qwen3ForCausalLM",
            "params": n_target,
            "hidden_size": sizes.hidden,
            "num_layers": sizes.target_layers,
            "num_heads": sizes.heads,
            "head_dim": sizes.head_dim,
            "intermediate_size": sizes.intermediate,
            "tie_word_embeddings": False,
            "dtype": "float32",
            "steps": args.target_steps,
            "batch": args.target_batch,
            "seq_len": args.seq_len,
            "lr": args.target_lr,
            "final_loss": round(float(np.mean(target_losses[-max(1, len(target_losses) // 20) :])), 4),
            "train_seconds": round(t_target, 1),
        }
        if target_info is None
        else {**target_info, "reused_from": str(args.target_from), "params": n_target},
        "drafter": {
            "architecture": "DFlashDraftModel (z-lab format)",
            "params": n_drafter,
            "num_layers": sizes.draft_layers,
            "block_size": BLOCK_SIZE,
            "target_layer_ids": drafter.config.target_layer_ids,
            "mask_token_id": mask_id,
            "intermediate_size": sizes.draft_intermediate,
            "steps": args.drafter_steps,
            "batch": args.drafter_batch,
            "anchors_per_step": args.anchors_per_step,
            "lr": args.drafter_lr,
            "distillation": {
                "groups": args.distill_groups,
                "group_size": args.distill_group_size,
                "continuation_tokens": args.distill_new_tokens,
                "max_prefix": args.distill_max_prefix,
                "temperatures": "even groups greedy (T=0), odd groups sampled (T=1)",
                "loss": "block cross-entropy on target tokens a+1..a+15, position weights exp(-(k-1)/8)",
                "seconds_generating": round(t_data, 1),
            },
            "final_loss": round(float(np.mean(drafter_losses[-max(1, len(drafter_losses) // 20) :])), 4),
            "final_token_accuracy": round(float(np.mean(drafter_accs[-max(1, len(drafter_accs) // 20) :])), 4),
            "train_seconds": round(t_drafter, 1),
        },
        "prompts": {
            "file": "prompts/fixture.jsonl",
            "per_category": args.prompts_per_category,
            "stream": f"Random(seed * 1000003 + {PROMPT_STREAM})",
            "held_out": "no prompt text occurs in the corpus",
            "sha256": sha256(prompts_path),
        },
        "files": files,
        "total_bytes": sum(v["bytes"] for v in files.values()),
        "acceptance_estimate": estimate,
        "build_seconds": round(time.time() - t_start, 1),
    }
    (fixture / "MANIFEST.json").write_text(json.dumps(manifest, indent=2) + "\n")
    log(f"wrote {fixture} ({manifest['total_bytes'] / 1e6:.2f} MB) and {prompts_path} in {manifest['build_seconds']} s")
    return manifest


def parse_args(argv: list[str] | None = None):
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--out",
        default=str(ROOT / "golden"),
        help="writes OUT/fixture/{target,drafter,MANIFEST.json} and OUT/prompts/fixture.jsonl",
    )
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument(
        "--quick", action="store_true", help="small slice: few docs, few steps (for tests; the model is untrained)"
    )
    ap.add_argument("--docs-per-category", type=int, default=None)
    ap.add_argument("--vocab-size", type=int, default=None)
    ap.add_argument("--target-steps", type=int, default=None)
    ap.add_argument("--target-batch", type=int, default=None)
    ap.add_argument("--target-lr", type=float, default=2e-3)
    ap.add_argument("--seq-len", type=int, default=None)
    ap.add_argument("--drafter-steps", type=int, default=None)
    ap.add_argument("--drafter-batch", type=int, default=None)
    ap.add_argument("--drafter-lr", type=float, default=2e-3)
    ap.add_argument("--anchors-per-step", type=int, default=None)
    ap.add_argument("--distill-groups", type=int, default=None)
    ap.add_argument("--distill-group-size", type=int, default=None)
    ap.add_argument("--distill-new-tokens", type=int, default=80)
    ap.add_argument("--distill-max-prefix", type=int, default=140)
    ap.add_argument("--prompts-per-category", type=int, default=20)
    ap.add_argument(
        "--estimate",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="simulate T=0 acceptance on the prompts after building (default: on unless --quick)",
    )
    ap.add_argument("--estimate-prompts", type=int, default=8, help="prompts per category for --estimate")
    ap.add_argument(
        "--target-from",
        default=None,
        help="reuse the tokenizer + target in this dir (e.g. OUT/fixture/target); build only the drafter",
    )
    ap.add_argument("--draft-layers", type=int, default=2)
    ap.add_argument(
        "--tf32", action=argparse.BooleanOptionalAction, default=True, help="TF32 matmuls in CUDA training steps"
    )
    ap.add_argument("--threads", type=int, default=None, help="CPU threads for torch (default: 1 with --quick)")
    args = ap.parse_args(argv)
    full = dict(
        docs_per_category=10000,
        vocab_size=3072,
        target_steps=3000,
        target_batch=64,
        seq_len=256,
        drafter_steps=300,
        drafter_batch=256,
        anchors_per_step=4,
        distill_groups=48,
        distill_group_size=256,
    )
    quick = dict(
        docs_per_category=60,
        vocab_size=700,
        target_steps=4,
        target_batch=4,
        seq_len=128,
        drafter_steps=3,
        drafter_batch=4,
        anchors_per_step=1,
        distill_groups=2,
        distill_group_size=4,
    )
    for key, value in (quick if args.quick else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.estimate is None:
        args.estimate = not args.quick
    if args.quick:
        args.distill_new_tokens = min(args.distill_new_tokens, 24)
        args.distill_max_prefix = min(args.distill_max_prefix, 32)
    args.argv = argv
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    threads = torch.get_num_threads()
    if args.threads or args.quick:
        torch.set_num_threads(args.threads or 1)  # small ops run faster single-threaded on busy CPUs
    try:
        return build(args)
    finally:
        torch.set_num_threads(threads)


if __name__ == "__main__":
    main()
