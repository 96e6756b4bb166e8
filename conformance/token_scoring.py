"""Scoring every output token of a low-precision run against the fp32 target (doc §7, made strict).

Each engine output is teacher-forced through the fp32 reference target, one causal forward over
``prompt + output``, and every output position is scored in the context the engine itself
produced (after an excused position, scoring goes on along the engine's own path):

* the engine's token is the fp32 argmax: a match;
* its fp32 logit is within the calibrated bound of the top-1 (``logit >= top1 - bound``): an
  *excused* position, a low-precision near-tie;
* otherwise the position is *outside the bound*: a wrong token, whatever came before.

A run fails on any position outside the bound, and when it has more excused positions than the
ceiling a correct engine can reach at the run's own fp32 gaps (:mod:`ddtree_conformance.calibration`
derives both). In float32 the bound is 0, so scoring is exact: every token must be the fp32 argmax.

Excused positions must also be explained by low-precision arithmetic measured in the same run
(:class:`TieTest`): the target runs teacher-forced in the run's own dtype on its device over the
same output, and an engine that leaves the fp32 argmax where that reference does not, significantly
more often than the reverse, fails (an engine taking the runner-up at near ties by rule).

Scores are cached per process (the same output is scored once however many checks read it, and an
output that starts a scored one is read from it), and each scorer is one per (model, dtype, device)
(:func:`ddtree_conformance.scorer.shared_scorer`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from functools import lru_cache

import torch

from .calibration import MAX_BOUND, CalibrationError, load_calibration
from .noise import ALPHA, FP32_TIE, NoiseModel, TokenCall
from .scorer import shared_scorer

__all__ = [
    "PositionScores",
    "TieTest",
    "TokenFinding",
    "ScoredRun",
    "LogitsSource",
    "target_logits",
    "table_logits",
    "score_output",
    "score_run",
    "rules_for",
    "hold_rules",
    "window",
]

_CACHE: OrderedDict = OrderedDict()
_CACHE_SIZE = 50_000
_LONGER: dict[tuple, list[tuple]] = {}  # (logits key, prompt) -> outputs scored by a forward of their own


@dataclass(frozen=True)
class PositionScores:
    """Per output position: the fp32 argmax, the engine token's distance below the top-1, the fp32
    top-1/top-2 gap (the smallest move that could flip the position) and the top-1/top-3 gap."""

    argmax: tuple[int, ...]
    gaps: tuple[float, ...]
    top2: tuple[float, ...]
    top3: tuple[float, ...] = ()

    def head(self, n: int) -> PositionScores:
        """The scores of the first ``n`` positions (a prefix of the output: a causal target scores
        it the same)."""
        return PositionScores(self.argmax[:n], self.gaps[:n], self.top2[:n], self.top3[:n])


@dataclass(frozen=True)
class LogitsSource:
    """A logits function ``sequence -> [T, V]`` (float32, one row per position) and the key its
    scores are cached under (two sources with one key give the same logits)."""

    key: tuple
    fn: Callable[[list[int]], torch.Tensor]


def target_logits(model_dir: str, device: str, dtype: str = "float32") -> LogitsSource:
    """The target's logits in ``dtype`` (fp32: the oracle; the run's low dtype: the same-dtype reference
    of the tie test), one cached scorer per process."""
    scorer = shared_scorer(str(model_dir), dtype, device)
    key = ("target", str(model_dir), device) if dtype == "float32" else ("target", str(model_dir), device, dtype)
    return LogitsSource(key, scorer.logits)


def table_logits(table: torch.Tensor, name: str) -> LogitsSource:
    """A bigram table's logits (synthetic pairs): row ``table[token]`` after each token."""
    return LogitsSource(
        ("table", name, tuple(table.flatten().tolist())),
        lambda sequence: table[torch.tensor(sequence, dtype=torch.long)].float(),
    )


def _scored_prefix(source_key, prompt: tuple, output: tuple) -> PositionScores | None:
    """Scores of ``output`` cut from a cached longer output of the same prompt that starts with it."""
    for longer in _LONGER.get((source_key, prompt), ()):
        if len(longer) > len(output) and longer[: len(output)] == output:
            cached = _CACHE.get((source_key, prompt, longer))
            if cached is not None:
                return cached.head(len(output))
    return None


def score_output(source: LogitsSource, prompt_ids: Sequence[int], output_ids: Sequence[int]) -> PositionScores:
    """Score every position of ``output_ids`` after ``prompt_ids``: cached per process, and an output
    that starts a scored one (a stop or a length limit cut it) is read from that one's scores."""
    key_fn, fn = source.key, source.fn
    prompt, output = tuple(prompt_ids), tuple(output_ids)
    key = (key_fn, prompt, output)
    if key in _CACHE:
        _CACHE.move_to_end(key)
        return _CACHE[key]
    scores = _scored_prefix(key_fn, prompt, output) if output else PositionScores((), (), (), ())
    if scores is None:
        logits = fn(list(prompt) + list(output[:-1]))[len(prompt) - 1 :].float()
        top = torch.topk(logits, min(3, logits.shape[-1]), dim=-1)
        tokens = torch.tensor(list(output), dtype=torch.long, device=logits.device).unsqueeze(1)
        gaps = (top.values[:, 0] - logits.gather(1, tokens).squeeze(1)).clamp(min=0.0)
        third = top.values[:, 0] - top.values[:, -1]
        # argmax, not topk's first index: with exact ties (frequent in bf16 logits) argmax takes the lowest
        # token id, as an engine's greedy choice does; topk's order among equal values is unspecified
        scores = PositionScores(
            tuple(logits.argmax(dim=-1).tolist()),
            tuple(gaps.tolist()),
            tuple((top.values[:, 0] - top.values[:, 1]).tolist()),
            tuple(third.tolist()),
        )
        _LONGER.setdefault((key_fn, prompt), []).append(output)
    _CACHE[key] = scores
    if len(_CACHE) > _CACHE_SIZE:
        old_key, _ = _CACHE.popitem(last=False)
        longer = _LONGER.get(old_key[:2])
        if longer and old_key[2] in longer:
            longer.remove(old_key[2])
    return scores


def window(values: Sequence, position: int, before: int = 3, after: int = 3) -> str:
    """``values`` around ``position``, that entry bracketed: ``... 4 7 [9] 2 5 ...``."""
    lo, hi = max(0, position - before), min(len(values), position + after + 1)
    cells = [f"[{values[i]}]" if i == position else str(values[i]) for i in range(lo, hi)]
    return ("... " if lo > 0 else "") + " ".join(cells) + (" ..." if hi < len(values) else "")


@dataclass
class TieTest:
    """The engine's near ties against the same-dtype reference's on the very same positions.

    At every scored position of a low-precision run the target also runs teacher-forced in the run's
    own dtype on its device (the reference's low-precision arithmetic on the engine's path). A
    position is *engine-only* when the engine leaves the fp32 argmax and the low-precision reference
    does not take the engine's token there; *reference-only* when the reference leaves the fp32
    argmax and the engine keeps it. Low-precision noise that the engine shares with the reference
    (the weights rounded the same way) flips both; noise of its own flips either side alike. An
    engine that takes the runner-up at near ties by rule piles up engine-only positions: the exact
    McNemar test (a one-sided binomial test of engine-only among the discordant positions,
    ``scipy.stats.binomtest``) fails it at ``ALPHA``.

    The test's pairs must be independent decisions. Outputs scored together often share a prefix: every
    greedy mode's run on one prompt starts with the prefill's token and goes on alike until the runs part,
    and a length limit's outputs are cut from one another. A position is therefore counted once per
    decision, the engine's token after one context (prompt and output before it), however many outputs
    hold it. Counted per output, the fixture pair's float16 reference failed its own pooled check (five runs
    on 20 prompts: 12 engine-only against 0, p = 0.00024); counted per decision, 3 against 0 (p = 0.12)."""

    engine_only: int = 0
    reference_only: int = 0
    both: int = 0
    rules: NoiseModel | None = None  # the share a correct engine may reach (NoiseModel.tie_test); None: 1/2
    # the decisions counted, as a trie: (parent node, token) -> node, a prompt's root keyed by the prompt itself,
    # so memory grows with the tokens counted, not with their prefixes' lengths
    seen: dict = field(default_factory=dict, repr=False)

    def add(self, tokens: Sequence[int], fp32: Sequence[int], low: Sequence[int], prompt: Sequence[int] = ()) -> None:
        """Count ``tokens`` (an output after ``prompt``) against the fp32 and low-precision argmax at each
        position; a decision already counted (the same prompt and output up to it) is not counted again."""
        node = self.seen.setdefault(("prompt", tuple(prompt)), len(self.seen))
        for token, best, ref in zip(tokens, fp32, low):
            decision = (node, int(token))
            known = decision in self.seen
            node = self.seen.setdefault(decision, len(self.seen))
            if known:
                continue
            engine_flips, reference_flips = token != best, ref != best
            if engine_flips and reference_flips and token == ref:
                self.both += 1
            elif engine_flips:
                self.engine_only += 1
            elif reference_flips:
                self.reference_only += 1

    @property
    def p_value(self) -> float:
        rules = self.rules or NoiseModel("bfloat16", 0.0, 0.0, 0, (), "even odds")
        return rules.tie_test(self.engine_only, self.reference_only)

    def details(self) -> dict:
        return {
            "engine_only": self.engine_only,
            "reference_only": self.reference_only,
            "both": self.both,
            "allowed_share": None if self.rules is None else self.rules.tie_share,
            "p_value": self.p_value,
        }


@dataclass(frozen=True)
class TokenFinding:
    """An output position whose token is not the fp32 argmax (excused within the bound, else outside)."""

    label: str
    position: int
    got: int
    argmax: int
    gap: float


@dataclass
class ScoredRun:
    """Every scored position of one check's outputs, and the verdict on them."""

    rules: NoiseModel
    outputs: int = 0
    positions: int = 0
    excused: list[TokenFinding] = field(default_factory=list)
    outside: list[TokenFinding] = field(default_factory=list)
    top2: list[float] = field(default_factory=list)
    detail: dict = field(default_factory=dict)  # label -> (output, argmax) for failure messages
    ties: TieTest | None = None  # low precision on the session's own target: against the same-dtype reference
    fp32_ties: int = 0  # float32: positions within FP32_TIE of the top-1 (ties, not wrong tokens)

    def add(
        self, label: str, prompt_ids: Sequence[int], output_ids: Sequence[int], logits_fn, low_fn=None
    ) -> PositionScores:
        scores = score_output(logits_fn, prompt_ids, output_ids)
        self.outputs += 1
        self.positions += len(output_ids)
        self.top2 += list(scores.top2)
        for i, (token, best, gap) in enumerate(zip(output_ids, scores.argmax, scores.gaps)):
            call = TokenCall.MATCH if token == best else self.rules.token(gap)
            if call is TokenCall.MATCH:
                continue
            if call is TokenCall.FP32_TIE:
                self.fp32_ties += 1
                continue
            entry = TokenFinding(label, i, token, best, round(gap, 6))
            (self.excused if call is TokenCall.NEAR_TIE else self.outside).append(entry)
            self.detail.setdefault(label, (list(output_ids), list(scores.argmax)))
        if low_fn is not None:
            self.ties = self.ties or TieTest(rules=self.rules)
            low = score_output(low_fn, prompt_ids, output_ids).argmax
            self.ties.add(output_ids, scores.argmax, low, prompt_ids)
        return scores

    @property
    def ceiling(self) -> tuple[int, float]:
        return self.rules.ceiling(self.top2)

    @property
    def largest_excused(self) -> float:
        return max((e.gap for e in self.excused), default=0.0)

    def summary(self) -> str:
        if self.rules.exact:
            ties = f" ({self.fp32_ties} at fp32 ties within {FP32_TIE:g})" if self.fp32_ties else ""
            return f"{self.positions} positions equal the fp32 target's argmax{ties}"
        ceiling, mu = self.ceiling
        ties = (
            ""
            if self.ties is None
            else (
                f"; {self.ties.both} shared with the {self.rules.dtype} reference, {self.ties.engine_only} "
                f"engine-only vs {self.ties.reference_only} reference-only, p = {self.ties.p_value:.2g}"
            )
        )
        return (
            f"{self.positions} positions scored, {len(self.excused)} excused (largest gap "
            f"{self.largest_excused:.3g} <= bound {self.rules.bound:.3g}; ceiling {ceiling}, expected <= "
            f"{mu:.1f}{ties})"
        )

    def problem(self) -> str | None:
        """Why these outputs fail (first position outside the bound; or the ceiling), else None."""
        notes = []
        if self.outside:
            first = self.outside[0]
            output, argmax = self.detail[first.label]
            pos = first.position
            what = (
                "are not the fp32 target's argmax on the output's own path"
                if self.rules.exact
                else f"outside the near-tie bound {self.rules.bound:.3g}"
            )
            notes.append(
                f"{len(self.outside)}/{self.positions} output positions {what}; first: {first.label} output "
                f"position {pos}: engine token {first.got} is {first.gap:.4g} below the fp32 top-1 "
                f"{first.argmax} (engine {window(output, pos)} | fp32 argmax on the engine's path "
                f"{window(argmax, pos)})"
            )
        ceiling, mu = self.ceiling
        if not self.rules.exact and len(self.excused) > ceiling:
            notes.append(
                f"{len(self.excused)}/{self.positions} positions excused as near-ties, above the ceiling {ceiling} a "
                f"correct engine reaches at these gaps (expected <= {mu:.1f}): the engine takes the runner-up at "
                f"near-ties far more often than low-precision noise does"
            )
        ties = self.ties
        if ties is not None and ties.p_value < ALPHA:
            notes.append(
                f"the engine leaves the fp32 argmax at {ties.engine_only} positions where the {self.rules.dtype} "
                f"reference on the same device and path does not, and keeps it at only {ties.reference_only} where "
                f"the reference leaves it ({ties.both} shared; McNemar exact p = {ties.p_value:.2g} < {ALPHA:g}): it "
                "takes the runner-up at near ties more often than low-precision arithmetic explains"
            )
        return "; ".join(notes) or None

    def details(self) -> dict:
        ceiling, mu = self.ceiling
        ties = {"ties_vs_same_dtype_reference": self.ties.details()} if self.ties is not None else {}
        return {
            "positions": self.positions,
            "excused": len(self.excused),
            "largest_excused_gap": self.largest_excused,
            "outside": len(self.outside),
            "ceiling": ceiling,
            "expected_excused": round(mu, 3),
            "bound": self.rules.bound,
            "excused_positions": [asdict(e) for e in self.excused[:50]],
            "outside_positions": [asdict(e) for e in self.outside[:50]],
            **ties,
        }


_HELD: dict[tuple[str, str], NoiseModel | CalibrationError] = {}


def hold_rules(model_dir: str, dtype: str, calibration: NoiseModel | CalibrationError) -> None:
    """Make ``calibration`` (derived from a manifest held in memory, :mod:`ddtree_conformance.oracle`)
    the one :func:`rules_for` gives for this pair and dtype from now on (an error: raised instead)."""
    _HELD[(str(model_dir), dtype)] = calibration


@lru_cache(maxsize=16)
def _loaded_calibration(model_dir: str, dtype: str) -> NoiseModel:
    return load_calibration(model_dir, dtype)


def _calibration(model_dir: str, dtype: str) -> NoiseModel:
    held = _HELD.get((model_dir, dtype))
    if isinstance(held, CalibrationError):
        raise held
    return held if held is not None else _loaded_calibration(model_dir, dtype)


def rules_for(settings) -> NoiseModel:
    """A run's low-precision rules (``settings``: a SuiteSettings): the pair's calibration, or the
    settings' bound (range-checked)."""
    s = settings
    rules = _calibration(str(s.model_dir), s.dtype)
    override = getattr(s, "near_tie_bound", None)
    if override is not None and not rules.exact:
        if not 0.0 <= override <= MAX_BOUND:
            raise CalibrationError(f"near_tie_bound {override} is outside 0..{MAX_BOUND} nats")
        rules = replace(rules, bound=float(override), source="settings near_tie_bound")
    return rules


def score_run(session, items, logits_fn=None, rules: NoiseModel | None = None) -> ScoredRun:
    """Score ``items`` (``(label, prompt_ids, output_ids)``) with the session's fp32 target."""
    s = session.settings
    run = ScoredRun(rules or rules_for(s))
    fn = logits_fn or target_logits(s.model_dir, s.device)
    # the tie test needs the same-dtype reference of the session's own target (not a synthetic table)
    low = target_logits(s.model_dir, s.device, s.dtype) if logits_fn is None and not run.rules.exact else None
    for label, prompt_ids, output_ids in items:
        run.add(label, prompt_ids, output_ids, fn, low)
    return run
