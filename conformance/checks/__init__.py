"""The conformance checks and the plan that selects them for a run.

Each check is a function ``check(session, **params) -> CheckResult``. It reads only the session's
settings and the engine's capabilities, never the engine's name. :func:`plan` lists the checks a
run will execute; :func:`run_plan` executes them (the CLI), and the pytest plugin turns each
planned check into one test item. How checks run (crashes, failed results, a dead engine) is
:mod:`.runner`'s business: :class:`PlannedCheck` and :func:`run_plan` live there.

Every check runs in every dtype: float32 verdicts are exact; bfloat16/float16 verdicts score each
output token against the fp32 target (:mod:`ddtree_conformance.token_scoring`) and replay each
round with the fp32 reference (:mod:`ddtree_conformance.replay`), within the pair's calibration
(:mod:`ddtree_conformance.calibration`). Per (mode, budget): lossless, golden, acceptance,
tree-structure, stop-token, max-new-tokens, prompt-shapes, token-0-and-mask-id, context-range,
busy-batch, tensor-parallel, cuda-graphs; per budget: branch-vs-chain; in bfloat16/float16 the near-tie
check pooled over every greedy run; at the first budget and for dflash: sampling.
"""

from __future__ import annotations

from collections.abc import Callable

from ..option_names import option
from ..run import Run
from ..settings import SettingsError, SuiteSettings
from .families import DECLARED, Family, Scope
from .near_ties import NEAR_TIES_ID
from .result import CheckResult
from .runner import PlannedCheck, run_plan
from .sampling import DRAWN, VARIANTS

__all__ = [
    "CheckResult",
    "PlannedCheck",
    "plan",
    "run_plan",
    "needs_golden",
    "PER_MODE_CHECKS",
    "GOLDEN_FAMILIES",
    "FAMILIES",
    "SPECULATIVE_MODES",
]

GOLDEN_FAMILIES = frozenset(f.name for f in DECLARED if f.reads_golden)  # families that read the golden file

PER_MODE_CHECKS: dict[str, Callable[..., CheckResult]] = {f.name: f.check for f in DECLARED if f.scope is Scope.PER_RUN}

#: every check family :func:`plan` can plan, in some run (``near-ties`` in bfloat16/float16 only,
#: ``branch-vs-chain`` with mode ddtree only), and the speculative modes a run can ask for
FAMILIES: tuple[str, ...] = tuple(f.name for f in DECLARED)
SPECULATIVE_MODES: tuple[str, ...] = ("dflash", "ddtree")


def _runs(settings: SuiteSettings) -> list[Run]:
    runs: list[Run] = []
    for mode in settings.modes:
        if mode == "ddtree":
            runs += [Run("ddtree", b) for b in settings.budgets]
        elif mode == "dflash":
            runs.append(Run("dflash"))
    return runs


def _scoped(scope: Scope) -> list[Family]:
    return [f for f in DECLARED if f.scope is scope]


def _planned(f: Family, check_id: str, run: Run | None, **params) -> PlannedCheck:
    return PlannedCheck(check_id, f.check, params, f.name, run, f.evidence)


def needs_golden(checks: list[PlannedCheck]) -> bool:
    """Whether these checks read the pair's golden file (a run that cannot read it stops before any work)."""
    return any(c.family in GOLDEN_FAMILIES for c in checks)


def plan(settings: SuiteSettings, only: list[str] | None = None) -> list[PlannedCheck]:
    """The checks for ``settings``; ``only`` (default ``settings.checks``) keeps check ids containing one
    of the given names. A filter that keeps nothing is a :class:`~ddtree_conformance.settings.SettingsError`
    naming the option as the front end spells it: a run that checks nothing must never look like a pass."""
    runs = _runs(settings)
    checks: list[PlannedCheck] = []
    for run in runs:
        params = {"mode": run.mode, "budget": run.budget}
        checks += [_planned(f, run.check_id(f.name), run, **params) for f in _scoped(Scope.PER_RUN)]
    ddtree = [run for run in runs if run.mode == "ddtree"]
    for f in _scoped(Scope.PER_BUDGET):
        checks += [_planned(f, run.check_id(f.name), run, budget=run.budget) for run in ddtree]
    if settings.dtype != "float32":  # the tie test pooled over every greedy run (float32: every token is exact)
        checks += [_planned(f, NEAR_TIES_ID, None, runs=runs) for f in _scoped(Scope.POOLED_LOW_PRECISION)]
    sampled = ddtree[:1] + [run for run in runs if run.mode == "dflash"]
    for f in _scoped(Scope.SAMPLED):
        for run in sampled:
            checks += [
                _planned(f, run.check_id(f.name, v), run, mode=run.mode, budget=run.budget, variant=v)
                for v in [*VARIANTS, DRAWN]
            ]
    only = only if only is not None else settings.checks
    if only:
        kept = [c for c in checks if any(name in c.id for name in only)]
        if not kept:
            raise SettingsError(
                f"{option('checks')} {','.join(only)} keeps none of the {len(checks)} planned checks "
                f"({', '.join(sorted({c.family for c in checks}))})"
            )
        checks = kept
    return checks
