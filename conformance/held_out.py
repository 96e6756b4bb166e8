"""Held-out prompts: drawn at run time as the pair's users write them, so no engine can tell them apart.

A bundled prompt set is public and fixed: an engine could recognise its prompts and behave only on
them. Each run therefore adds prompts nobody has seen, drawn from the run's seed by the prompt set's
*source*, the same distribution a user's prompts come from, and sharing no structure with the
bundled prompts (no openings, prefixes, concatenations or lengths of theirs):

* :class:`TemplateSource`, for the bundled ``fixture`` set (whatever the pair: its text is formatted
  like the set's): the templates the fixture pair's corpus and prompts were written with
  (:mod:`ddtree_conformance.fixture_text`), a fresh document cut at a natural point to 20-120 tokens,
  exactly as ``scripts/build_fixture.py`` cut the bundled prompts and as the pair's users write
  theirs. Only the seed decides which prompts; the distribution is public and is the users' own.
* :class:`TargetSource`, for any other set (a user's own ``--prompts``): text the fp32 target samples
  itself at temperature 1, after the target's ``bos_token_id`` (kept) or ``eos_token_id`` (dropped),
  else after a drawn token (kept), to a length drawn near one of the set's own (a set length times a
  factor in [0.75, 1.25]). The user's own prompts are in the run beside them; what the target samples
  is recognisable by its perplexity under the target (``docs/reference/held-out-prompts.md``).

Each source also writes the long prompts of the context-range check (:meth:`PromptSource.long_ids`):
fresh text of the same kind, cut to an exact length.

Everything is drawn from the run's seed, which the report records with the prompts, so a failing
run can be repeated exactly (``--run-seed``).
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from functools import cached_property, lru_cache
from pathlib import Path

import torch

from . import fixture_text
from .paths import FIXTURE_TARGET, PROMPTS_DIR
from .prompts import Prompt, PromptError, format_prompts, resolve_prompt_set

__all__ = ["HELD_OUT_CATEGORY", "PromptSource", "TemplateSource", "TargetSource", "prompt_source", "held_out_prompts"]

HELD_OUT_CATEGORY = "held-out"
LENGTH_FACTOR = (0.75, 1.25)  # a target-sampled prompt's length: a set length times a factor in this range
TEMPLATE_SETS = {"fixture": fixture_text}  # bundled sets whose prompts the templates of that module write


class PromptSource:
    """Where a run's fresh prompts come from (module doc)."""

    kind = ""

    def held_out(self, count: int, seed: int, max_length: int | None = None) -> list[Prompt]:
        raise NotImplementedError

    def long_ids(self, lengths: Sequence[int], seed: int) -> list[list[int]]:
        """One fresh prompt of exactly each of ``lengths`` tokens, each from its own text."""
        raise NotImplementedError


def _held_out_id(seed: int, i: int) -> str:
    return f"held-out-{seed}-{i}"


class TemplateSource(PromptSource):
    """Prompts as the fixture pair's users write them (module doc); ``prompt_format`` and ``model_dir``
    format them like the set's own prompts; ``bundled`` texts are never drawn again."""

    kind = "templates"

    def __init__(self, module, model_dir: str, prompt_format: str, bundled: Sequence[Prompt] = ()) -> None:
        self.module = module
        self.model_dir = model_dir
        self.prompt_format = prompt_format
        self.bundled_texts = {p.text for p in bundled if p.text}

    @cached_property
    def _encode(self):
        """The templates' own tokenizer (the fixture target's): prompt lengths and cuts are in its tokens."""
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(FIXTURE_TARGET / "tokenizer.json"))
        return lambda text: list(tokenizer.encode(text).ids)

    def _format(self, prompts: list[Prompt]) -> list[Prompt]:
        return format_prompts(prompts, self.model_dir, self.prompt_format)

    def held_out(self, count: int, seed: int, max_length: int | None = None) -> list[Prompt]:
        rng = random.Random(f"held-out:{seed}")
        out: list[Prompt] = []
        while len(out) < count:
            category, text, ids = self.module.draw_prompt(rng, self._encode)
            if text in self.bundled_texts:
                continue
            out.append(
                Prompt(
                    id=_held_out_id(seed, len(out)),
                    category=HELD_OUT_CATEGORY,
                    text=text,
                    prompt_ids=ids,
                    meta={"seed": seed, "source": self.kind},
                )
            )
        out = self._format(out)
        if max_length is not None:
            out = [p.model_copy(update={"prompt_ids": p.prompt_ids[:max_length]}) for p in out]
        return out

    def long_ids(self, lengths: Sequence[int], seed: int) -> list[list[int]]:
        """Documents of random categories, one after another, to each length (the pair's tokens)."""
        rng = random.Random(f"long:{seed}")
        texts: list[list[str]] = [[] for _ in lengths]
        out: list[list[int] | None] = [None] * len(lengths)
        while any(ids is None for ids in out):
            todo = [k for k, ids in enumerate(out) if ids is None]
            for k in todo:  # about a fifth more of the templates' tokens than needed: one formatting pass, mostly
                have = sum(len(self._encode(doc)) for doc in texts[k])
                while have < lengths[k] * 1.2 + 8:
                    doc = self.module.GENERATORS[rng.choice(self.module.CATEGORIES)](rng)
                    texts[k].append(doc)
                    have += len(self._encode(doc))
            joined = ["".join(texts[k]) for k in todo]
            formatted = self._format(
                [Prompt(id=f"long-{k}", text=t, prompt_ids=self._encode(t)) for k, t in zip(todo, joined)]
            )
            for k, prompt in zip(todo, formatted):
                if len(prompt.prompt_ids) >= lengths[k]:
                    out[k] = prompt.prompt_ids[: lengths[k]]
                else:  # another tokenizer needs more of the text: one more document
                    texts[k].append(self.module.GENERATORS[rng.choice(self.module.CATEGORIES)](rng))
        return [ids for ids in out if ids is not None]


def _start_token(model_dir: str) -> tuple[int | None, bool]:
    """The token target samples start after, and whether a prompt keeps it: ``bos_token_id`` (kept),
    else ``eos_token_id`` (dropped: a document boundary), else none (a drawn token, kept)."""
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        config = {}
    for key, keep in (("bos_token_id", True), ("eos_token_id", False)):
        value = config.get(key)
        if isinstance(value, list):
            value = value[0] if value else None
        if isinstance(value, int) and not isinstance(value, bool):
            return value, keep
    return None, True


class TargetSource(PromptSource):
    """Text the fp32 target samples itself (module doc), on ``device``, with a KV cache, in one batch
    per call."""

    kind = "target samples"

    def __init__(self, model_dir: str, device: str, bundled: Sequence[Prompt] = ()) -> None:
        self.model_dir = model_dir
        self.device = device
        self.lengths = sorted(len(p.prompt_ids) for p in bundled) or [32]

    def _sample(self, lengths: Sequence[int], seed: int) -> list[list[int]]:
        """One sampled sequence of exactly each of ``lengths`` tokens (temperature 1); the same draw is
        sampled once per process (:func:`_target_samples`), as the target itself is loaded once."""
        return [list(row) for row in _target_samples(str(self.model_dir), self.device, tuple(lengths), seed)]

    def held_out(self, count: int, seed: int, max_length: int | None = None) -> list[Prompt]:
        rng = random.Random(f"held-out:{seed}")
        lengths = []
        for _ in range(count):
            base = rng.choice(self.lengths)
            length = max(1, round(base * rng.uniform(*LENGTH_FACTOR)))
            lengths.append(min(length, max_length) if max_length else length)
        sampled = self._sample(lengths, rng.getrandbits(63))
        return [
            Prompt(
                id=_held_out_id(seed, i),
                category=HELD_OUT_CATEGORY,
                prompt_ids=ids,
                meta={"seed": seed, "source": self.kind},
            )
            for i, ids in enumerate(sampled)
        ]

    def long_ids(self, lengths: Sequence[int], seed: int) -> list[list[int]]:
        return self._sample(lengths, random.Random(f"long:{seed}").getrandbits(63))


@lru_cache(maxsize=64)
@torch.inference_mode()
def _target_samples(model_dir: str, device: str, lengths: tuple[int, ...], seed: int) -> tuple[tuple[int, ...], ...]:
    """:meth:`TargetSource._sample`'s draw: a function of the model (loaded once per process by
    :func:`~.scorer.shared_scorer`, so keyed, like it, by the model's folder), the device, the lengths and
    the seed; kept per process, since every session of a test run or a plugin run draws the same."""
    if not lengths:
        return ()
    from .scorer import shared_scorer

    model = shared_scorer(model_dir, "float32", device).model
    dev = next(model.parameters()).device
    vocab = int(model.config.vocab_size)
    generator = torch.Generator().manual_seed(seed)
    start, keep = _start_token(model_dir)
    n = len(lengths)
    if start is None:
        first = torch.randint(0, vocab, (n, 1), generator=generator)
    else:
        first = torch.full((n, 1), start, dtype=torch.long)
    tokens = [first]
    total = max(lengths) - (1 if keep else 0)
    out = model(input_ids=first.to(dev), use_cache=True)
    for step in range(total):
        probs = torch.softmax(out.logits[:, -1].float().cpu(), dim=-1)
        nxt = torch.multinomial(probs, 1, generator=generator)
        tokens.append(nxt)
        if step + 1 < total:
            out = model(input_ids=nxt.to(dev), past_key_values=out.past_key_values, use_cache=True)
    rows = torch.cat(tokens, dim=1)[:, (0 if keep else 1) :].tolist()
    return tuple(tuple(row[:length]) for row, length in zip(rows, lengths))


def _template_module(prompt_set: str):
    """The templates module writing this prompt set's prompts, when it is a bundled set that has one."""
    try:
        path = resolve_prompt_set(prompt_set).resolve()
    except PromptError:
        return None
    for name, module in TEMPLATE_SETS.items():
        if path == (PROMPTS_DIR / f"{name}.jsonl").resolve():
            return module
    return None


def prompt_source(settings, bundled: Sequence[Prompt]) -> PromptSource:
    """The source of a run's fresh prompts for ``settings`` (a :class:`~ddtree_conformance.settings.SuiteSettings`)
    whose prompt set is ``bundled`` (module doc)."""
    module = _template_module(settings.prompt_set)
    if module is not None:
        return TemplateSource(module, settings.model_dir, settings.prompt_format, bundled)
    return TargetSource(settings.model_dir, settings.device, bundled)


def held_out_prompts(source: PromptSource, count: int, seed: int, max_length: int | None = None) -> list[Prompt]:
    """``count`` held-out prompts from ``source``, ids ``held-out-<seed>-<i>``; ``max_length`` caps a
    prompt's length (the context left after the run's new tokens)."""
    if count <= 0:
        return []
    return source.held_out(count, seed, max_length)
