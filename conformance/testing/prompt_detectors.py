"""The detectors an engine team would build from this repository to tell the suite's prompts from a
user's, and the statistics that say whether they beat chance (issue 32, item 2).

Each detector scores a prompt (token ids of the fixture pair); a higher score says "the suite's":

* ``suite-detector``: :class:`~ddtree_conformance.testing.input_adversaries.SuiteDetector`, the rule of
  the adversary engine (a bundled prompt, a prefix of one, a join of them, or the old held-out recipe:
  1-8 opening tokens of a bundled prompt and a bundled prompt's length), 1 or 0;
* ``bundled-prefix``: the longest prefix shared with any bundled prompt, in tokens;
* ``bundled-length``: whether the length is one of the bundled prompts' lengths;
* ``length``: the length itself;
* ``bundled-4grams``: the share of the prompt's token 4-grams that occur in the bundled prompts;
* ``perplexity``: the mean negative log-likelihood per token under the fp32 target (the engine has
  the target's logits of every prompt token from its own prefill, for free);
* ``classifier``: a logistic regression on all of the above, trained on prompts of both kinds drawn
  apart from the ones it is scored on.

:func:`compare` scores two groups of prompts and tests each detector against chance with the
Mann-Whitney U test (two-sided; the AUC is U / (n1 n2), 0.5 for chance, and for a yes/no detector it
is its balanced accuracy); ``tests/test_input_adversaries.py`` and ``scripts/held_out_detectors.py``
use it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from scipy.stats import mannwhitneyu

from .input_adversaries import SuiteDetector

__all__ = ["DETECTORS", "DetectorResult", "Scorer", "compare", "user_prompts", "old_recipe_prompts"]

DETECTORS = (
    "suite-detector",
    "bundled-prefix",
    "bundled-length",
    "length",
    "bundled-4grams",
    "perplexity",
    "classifier",
)


@dataclass(frozen=True)
class DetectorResult:
    name: str
    auc: float  # P(score of a suite prompt > a user prompt's) + half the ties; 0.5 is chance
    p_value: float  # Mann-Whitney U, two-sided
    suite_mean: float
    user_mean: float


class Scorer:
    """Scores prompts with every detector (module doc); ``bundled``: the bundled set's ids; ``logits_fn``:
    the fp32 target (token ids -> ``[T, V]`` logits)."""

    def __init__(self, bundled: Sequence[Sequence[int]], logits_fn: Callable) -> None:
        self.bundled = [tuple(ids) for ids in bundled]
        self.detector = SuiteDetector(self.bundled)
        self.lengths = {len(ids) for ids in self.bundled}
        self.grams = {ids[i : i + 4] for ids in self.bundled for i in range(len(ids) - 3)}
        self.logits_fn = logits_fn

    def _prefix(self, ids: tuple) -> int:
        best = 0
        for b in self.bundled:
            n = 0
            for x, y in zip(ids, b):
                if x != y:
                    break
                n += 1
            best = max(best, n)
        return best

    def _nll(self, ids: tuple) -> float:
        if len(ids) < 2:
            return 0.0
        with torch.inference_mode():
            logits = self.logits_fn(list(ids))[:-1].float().cpu()
        logp = torch.log_softmax(logits, dim=-1)
        return float(-logp[torch.arange(len(ids) - 1), torch.tensor(ids[1:])].mean())

    def features(self, prompt_ids: Sequence[int]) -> list[float]:
        ids = tuple(prompt_ids)
        grams = [ids[i : i + 4] for i in range(len(ids) - 3)]
        return [
            float(self.detector(ids)),
            float(self._prefix(ids)),
            float(len(ids) in self.lengths),
            float(len(ids)),
            sum(g in self.grams for g in grams) / len(grams) if grams else 0.0,
            self._nll(ids),
        ]


def _logistic(x_train: np.ndarray, y_train: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """A logistic regression (standardised features, light L2, gradient descent); returns its scorer."""
    mu, sd = x_train.mean(0), x_train.std(0) + 1e-9

    def design(x: np.ndarray) -> np.ndarray:
        return np.c_[(x - mu) / sd, np.ones(len(x))]

    z, w = design(x_train), np.zeros(x_train.shape[1] + 1)
    for _ in range(2000):
        p = 1 / (1 + np.exp(-z @ w))
        w -= 0.5 * (z.T @ (p - y_train) / len(y_train) + 1e-3 * w)
    return lambda x: design(x) @ w


def compare(
    scorer: Scorer,
    suite: Sequence[Sequence[int]],
    users: Sequence[Sequence[int]],
    train_suite: Sequence[Sequence[int]],
    train_users: Sequence[Sequence[int]],
) -> list[DetectorResult]:
    """Every detector's AUC and Mann-Whitney p-value for ``suite`` prompts against ``users``' (module doc);
    the classifier is trained on ``train_suite`` against ``train_users``, drawn apart from both."""
    x_suite = np.array([scorer.features(ids) for ids in suite])
    x_user = np.array([scorer.features(ids) for ids in users])
    x_train = np.array([scorer.features(ids) for ids in [*train_suite, *train_users]])
    y_train = np.r_[np.ones(len(train_suite)), np.zeros(len(train_users))]
    classify = _logistic(x_train, y_train)
    columns = [(x_suite[:, j], x_user[:, j]) for j in range(x_suite.shape[1])]
    columns.append((classify(x_suite), classify(x_user)))
    out = []
    for name, (a, b) in zip(DETECTORS, columns):
        if np.all(a == a[0]) and np.all(b == a[0]):  # one constant score for both: no information at all
            auc, p = 0.5, 1.0
        else:
            test = mannwhitneyu(a, b, alternative="two-sided")
            auc, p = float(test.statistic) / (len(a) * len(b)), float(test.pvalue)
        out.append(DetectorResult(name, auc, p, float(np.mean(a)), float(np.mean(b))))
    return out


def user_prompts(seed: int, per_category: int, encode: Callable[[str], list[int]]) -> list[list[int]]:
    """Prompts a user of the fixture pair writes: ``scripts/build_fixture.py``'s prompt recipe (its
    ``make_prompts``: per category, fresh documents cut at a natural point to 20-120 tokens, in its
    own random stream) with another seed, no training corpus to avoid."""
    import random

    from ddtree_conformance import fixture_text

    rng = random.Random(seed * 1_000_003 + 7_919)  # build_fixture's PROMPT_STREAM
    out = []
    for category in fixture_text.CATEGORIES:
        made, seen = 0, set()
        while made < per_category:
            cuts = fixture_text.prompt_cuts(category, fixture_text.GENERATORS[category](rng), encode)
            if not cuts:
                continue
            text, ids = rng.choice(cuts)
            if text in seen:
                continue
            seen.add(text)
            out.append(ids)
            made += 1
    return out


def old_recipe_prompts(bundled: Sequence[Sequence[int]], model, count: int, seed: int) -> list[list[int]]:
    """Held-out prompts as the suite drew them before issue 32 (``held_out_prompts`` at 78610c1): 1-8
    opening tokens of a bundled prompt, then the fp32 target's (``model``, a transformers causal LM)
    samples at temperature 1, to a bundled prompt's length; sampled here with a KV cache."""
    import random

    rng = random.Random(seed)
    lengths = sorted(len(ids) for ids in bundled)
    out = []
    for _ in range(count):
        source = list(rng.choice(list(bundled)))
        length = rng.choice(lengths)
        opening = min(rng.randint(1, 8), len(source), length)
        ids = source[:opening]
        generator = torch.Generator().manual_seed(rng.getrandbits(63))
        with torch.inference_mode():
            step = model(input_ids=torch.tensor([ids]), use_cache=True)
            while len(ids) < length:
                probs = torch.softmax(step.logits[0, -1].float(), dim=-1)
                ids.append(int(torch.multinomial(probs, 1, generator=generator)))
                if len(ids) < length:
                    cache = step.past_key_values
                    step = model(input_ids=torch.tensor([ids[-1:]]), past_key_values=cache, use_cache=True)
        out.append(ids)
    return out
