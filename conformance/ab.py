"""A/B throughput: the candidate engine against a baseline build, interleaved on the same runner.

Stored baselines drift between machines; an A/B run needs none. ``bench --against ENGINE`` runs a
second engine build beside the candidate in the same job, on the same requests and configurations,
and judges the pair's throughput ratio:

* the baseline is an engine named here (a built-in or entry-point name, or ``module:Class``), or a
  build of the candidate's engine to install: a requirement (``my-engine==1.3``, ``my-engine @
  git+https://...@<merge-base>``), a wheel or a source folder. An installed build goes into its own
  overlay environment (:func:`overlay_environment`: a venv that sees this environment's packages
  behind its own), and runs in a child process under that interpreter
  (:class:`~ddtree_conformance.adapters.process.IsolatedEngine`'s ``python``/``sys_path``);
* the measurement is the bench's: :func:`ddtree_conformance.paired.measure` with two arms per run
  (``candidate|<label>`` and ``baseline|<label>``, the same ``RunConfig``), called in pairs for each
  request (:func:`pair_order`: which side goes first alternates with request and repeat, runs rotate),
  and one :class:`~ddtree_conformance.bench.Stream` per run whose per-repeat sample is the ratio of
  decode tokens per second, candidate over baseline, on the engines' own clock;
* the verdict is the sequential test's (:mod:`ddtree_conformance.sequential`): repeats go on until
  the ratio's interval clears the edge ``1 - tolerance`` (pass: at or above; regression: wholly
  below) or the plan's time budget or repeat cap runs out (inconclusive). ``gate`` recomputes each
  interval from the report's samples (:func:`evaluate`), never trusting the report's own.
"""

from __future__ import annotations

import json
import os
import re
import site
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement

from .ab_gate import ab_verdict, evaluate, exit_code
from .adapters.interface import Engine, Request, RunConfig
from .adapters.registry import available_engines
from .bench import acceptance_summary, machine_part
from .gate import speedup_interval
from .machine_state import Sampler, describe
from .option_names import option
from .paired import Arm, BenchError, Measured, Repeat, Stream, WarmupRule, measure
from .sequential import METHOD, SPENDING, SequentialPlan, look_alpha

__all__ = [
    "Baseline",
    "AgainstError",
    "DEFINITION",
    "baseline_for",
    "overlay_environment",
    "pair_order",
    "balanced_pair_order",
    "measure_ab",
    "evaluate",
    "ab_verdict",
    "exit_code",
]

DEFINITION = (
    "ratio = candidate decode tokens/s / baseline decode tokens/s per repeat (same requests and "
    "configuration, same runner, called in pairs); geometric mean over repeats; the candidate passes "
    "when the whole interval is at or above 1 - tolerance"
)
_ENGINE_SPEC = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")


class AgainstError(ValueError):
    """``--against`` names nothing usable, or its build cannot be installed; the message says which."""


@dataclass(frozen=True)
class Baseline:
    """The baseline build: the engine spec it runs as, and the environment it runs in (``python`` and
    ``sys_path`` of an overlay environment; None: this one)."""

    spec: str
    source: str
    installed: bool = False
    python: str | None = None
    sys_path: tuple[str, ...] | None = None

    def describe(self) -> str:
        return f"{self.spec} from {self.source} (installed apart)" if self.installed else self.spec


def _is_engine_here(against: str) -> bool:
    return against in available_engines() or bool(_ENGINE_SPEC.fullmatch(against))


def _install_source(against: str) -> str:
    """``against`` as something pip installs: an existing wheel or folder, or a valid requirement."""
    path = Path(against).expanduser()
    if path.exists():
        if path.is_file() and path.suffix != ".whl":
            raise AgainstError(f"{option('against')} {against}: a file must be a wheel (.whl)")
        return str(path.resolve())
    try:
        Requirement(against)
    except InvalidRequirement as exc:
        raise AgainstError(
            f"{option('against')} {against!r}: not an engine here (a built-in or entry-point name, or "
            f"module:Class), not a wheel or folder, and not a requirement ({exc})"
        ) from None
    return against


def overlay_environment(folder: Path, source: str, *, runner: Callable = subprocess.run) -> tuple[str, list[str]]:
    """A venv at ``folder`` that sees this environment's packages behind its own, with ``source``
    installed into it; returns its interpreter and import path. The baseline's packages win over the
    candidate's; everything else (the suite, torch) is shared, so the install stays small."""
    folder.mkdir(parents=True, exist_ok=True)
    env = folder / "env"
    if not (env / "bin" / "python").exists():
        runner([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True, capture_output=True)
    python = str(env / "bin" / "python")
    found = runner(
        [python, "-c", "import json, site; print(json.dumps(site.getsitepackages()))"],
        check=True,
        capture_output=True,
        text=True,
    )
    own_site = Path(json.loads(found.stdout)[0])
    shared = [p for p in site.getsitepackages() + [site.getusersitepackages()] if os.path.isdir(p)]
    # .pth lines starting with "import" run at start-up: addsitedir also reads the shared sites' own .pth
    # files (editable installs), and appends them after this environment's own site-packages
    (own_site / "_ddtree_candidate_env.pth").write_text(
        "import site; " + "; ".join(f"site.addsitedir({p!r})" for p in shared) + "\n"
    )
    log = folder / "install.log"
    done = runner(
        [sys.executable, "-m", "pip", "--python", python, "install", "--disable-pip-version-check", source],
        capture_output=True,
        text=True,
    )
    log.write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
        raise AgainstError(f"{option('against')} {source}: pip could not install it into {env} (log {log}):\n{tail}")
    path = runner(
        [python, "-c", "import json, sys; print(json.dumps(sys.path))"], check=True, capture_output=True, text=True
    )
    # without -c's working-directory entry: a candidate module:Class found in the working directory must not
    # shadow the baseline build installed here
    return python, [p for p in json.loads(path.stdout) if p]


def baseline_for(
    against: str, engine_spec: str, work: Path, *, against_engine: str | None = None, runner: Callable = subprocess.run
) -> Baseline:
    """What ``--against`` names (module doc); an install happens here, into ``work``."""
    against = against.strip()
    if not against:
        raise AgainstError(f"{option('against')}: name the baseline (an engine, a requirement, a wheel or a folder)")
    if _is_engine_here(against) and not Path(against).exists():
        return Baseline(spec=against_engine or against, source=against)
    source = _install_source(against)
    python, sys_path = overlay_environment(work, source, runner=runner)
    return Baseline(
        spec=against_engine or engine_spec, source=against, installed=True, python=python, sys_path=tuple(sys_path)
    )


# ---------------------------------------------------------------------------------------------- measuring

CANDIDATE, BASELINE = "candidate", "baseline"


def parse_ab_spread(text: str) -> tuple[float, int]:
    """``--ab-spread SD:DF`` (``0.0021:18``, as ``scripts/ab_bias.py --pool`` prints ``ab_spread``) as (the variance
    of the log ratio, its degrees of freedom); anything else is a ValueError naming the option."""
    try:
        sd, df = text.split(":")
        sd_f, df_i = float(sd), int(df)
        if 0 < sd_f < 1 and df_i >= 1:
            return sd_f**2, df_i
    except ValueError:
        pass
    raise ValueError(f"--ab-spread must be SD:DF with 0 < SD < 1 and DF >= 1 (e.g. 0.0235:10), got {text!r}")


def _arm(side: str, label: str) -> str:
    return f"{side}|{label}"


def pair_order(running: list[str], r: int, i: int) -> list[str]:
    """Call order for request ``i`` of repeat ``r``: each run's two arms back to back (the candidate first
    when ``r + i + k`` is even for the k-th run, else the baseline), the runs rotated by the repeat."""
    labels = list(dict.fromkeys(name.split("|", 1)[1] for name in running))
    rotated = labels[r % len(labels) :] + labels[: r % len(labels)] if labels else []
    order = []
    for k, label in enumerate(rotated):
        pair = [_arm(CANDIDATE, label), _arm(BASELINE, label)]
        order += pair if (r + i + k) % 2 == 0 else pair[::-1]
    return [name for name in order if name in running]


def balanced_pair_order(running: list[str], r: int, i: int) -> list[str]:
    """:func:`pair_order` with each run's pair called twice, in both orders (candidate, baseline, baseline,
    candidate, or the reverse): for an odd number of requests per repeat, where alternating by request
    cannot balance a repeat, every repeat still has each arm first as often as second, so an order effect
    (the second call of a pair measured slower than the first) cancels at every look, not only over two
    repeats."""
    once = pair_order(running, r, i)
    out = []
    for k in range(0, len(once), 2):
        pair = once[k : k + 2]
        out += pair + pair[::-1]
    return out


def _throughput_ratio(label: str) -> Callable[[Repeat], float]:
    def sample(repeat: Repeat) -> float:
        a, b = repeat.totals[_arm(CANDIDATE, label)], repeat.totals[_arm(BASELINE, label)]
        if a.clock != b.clock:
            raise BenchError(
                f"{label}: the candidate is timed on the {a.clock} clock, the baseline on the {b.clock} "
                "clock: their throughputs cannot be compared"
            )
        return (a.tokens / a.seconds) / (b.tokens / b.seconds)

    return sample


def measure_ab(
    candidate: Engine,
    baseline: Engine,
    requests: list[Request],
    configs: dict[str, RunConfig],
    *,
    tolerance: float = 0.05,
    plan: SequentialPlan | None = None,
    warmup: bool | WarmupRule = True,
    on_step: Callable[[str], None] | None = None,
    now: Callable[[], float] = time.perf_counter,
    sampler: Sampler | None = None,
    spread: tuple[float, int] | None = None,
    prime: bool = True,
) -> dict:
    """The ``ab``, ``runs`` and ``verdict`` parts of an A/B report: for each run label in ``configs``, the
    candidate's and the baseline's throughput on the same requests, their ratio and its sequential
    decision against ``1 - tolerance``. ``spread``: the between-process variance of the log ratio (and its
    degrees of freedom) that A/A runs on this kind of runner measured (``--ab-spread``,
    ``scripts/ab_bias.py --pool``): each build runs in its own process, and a process's speed offset is
    constant within a run, so no run's own interval covers it; the interval includes it."""
    if not 0 <= tolerance < 1:
        raise BenchError(f"tolerance must be in [0, 1), got {tolerance}")
    plan = plan or SequentialPlan()
    edge = 1.0 - tolerance
    arms = [
        Arm(_arm(side, label), engine, config)
        for label, config in configs.items()
        for side, engine in ((CANDIDATE, candidate), (BASELINE, baseline))
    ]
    streams = [
        Stream(label, (_arm(CANDIDATE, label), _arm(BASELINE, label)), _throughput_ratio(label), edge, spread)
        for label in configs
    ]
    device = next(iter(configs.values())).device if configs else "cpu"
    sampler = sampler if sampler is not None else Sampler(device)
    # an even number of requests balances each repeat by alternation; an odd one calls each pair both ways
    order = pair_order if len(requests) % 2 == 0 else balanced_pair_order
    measured = measure(
        arms,
        requests,
        streams,
        plan=plan,
        warmup=warmup,
        order=order,
        on_step=on_step,
        now=now,
        sampler=sampler,
        prime=prime,
    )
    plan = measured.plan or plan  # as re-planned within the time budget: the report's looks and levels
    runs = [_ab_run(label, config, measured, plan, edge, spread) for label, config in configs.items()]
    ab = {
        "tolerance": tolerance,
        "edge": edge,
        "definition": DEFINITION,
        "ci": f"{METHOD}; {SPENDING}",
        "plan": plan.as_report(),
        "repeats": len(measured.history),
        "requests": len(requests),
        "order": "each run's two arms back to back; which goes first alternates with request and repeat"
        if order is pair_order
        else "each run's two arms back to back, twice per request in both orders (an odd number of requests)",
        **machine_part(measured, sampler),
    }
    ab = {**ab, "machine_line": describe(ab["machine"]), "runs": [_row(run) for run in runs]}
    part = {"ab": ab, "runs": runs}
    return {**part, "verdict": ab_verdict(evaluate(part))}


def _ab_run(
    label: str,
    config: RunConfig,
    measured: Measured,
    plan: SequentialPlan,
    edge: float,
    spread: tuple[float, int] | None,
) -> dict:
    """One entry of the report's ``runs``: the run's acceptance and its ``ab`` part (samples, rates, stop)."""
    cand = acceptance_summary(measured.first[_arm(CANDIDATE, label)])
    base = acceptance_summary(measured.first[_arm(BASELINE, label)])
    return {
        "mode": config.mode,
        "budget": config.budget if config.mode == "ddtree" else None,
        "label": label,
        **cand,
        "baseline_tau": base.get("tau"),
        "ab": _ab_part(label, measured, plan, edge, spread),
    }


def _ab_part(
    label: str, measured: Measured, plan: SequentialPlan, edge: float, spread: tuple[float, int] | None
) -> dict:
    """A run's ``ab`` part: its per-repeat ratios and rates up to its stop, the plan, and its interval."""
    stop = measured.stop[label]
    history = measured.history[: stop["repeats"]]
    samples = [_throughput_ratio(label)(h) for h in history]
    rates = {
        side: [round(h.totals[_arm(side, label)].tokens / h.totals[_arm(side, label)].seconds, 3) for h in history]
        for side in (CANDIDATE, BASELINE)
    }
    looks_planned = len(plan.looks())
    ab = {
        "samples": [round(x, 6) for x in samples],
        "edge": edge,
        "alpha": plan.alpha,
        "sequential": True,
        "min_repeats": plan.min_repeats,
        "max_repeats": plan.max_repeats,
        "growth": plan.growth,
        "looks_planned": looks_planned,
        "look_alpha": look_alpha(plan.alpha, looks_planned, True),
        "stop": {k: (round(v, 3) if isinstance(v, float) else v) for k, v in stop.items()},
        "candidate_tokens_per_s": rates[CANDIDATE],
        "baseline_tokens_per_s": rates[BASELINE],
        "clock": history[0].totals[_arm(CANDIDATE, label)].clock,
    }
    if spread:
        ab["spread"] = {"log_var": spread[0], "df": spread[1]}
    interval = speedup_interval(ab, spread)
    if interval is None:
        return ab
    return {
        **ab,
        "estimate": round(interval.estimate, 6),
        "ci_low": round(interval.low, 6),
        "ci_high": round(interval.high, 6),
        "confidence": interval.level,
    }


def _row(run: dict) -> dict:
    ab = run["ab"]
    med = {
        side: sorted(ab[f"{side}_tokens_per_s"])[len(ab[f"{side}_tokens_per_s"]) // 2] for side in (CANDIDATE, BASELINE)
    }
    return {
        "label": run["label"],
        "candidate_tokens_per_s": med[CANDIDATE],
        "baseline_tokens_per_s": med[BASELINE],
        "estimate": ab.get("estimate"),
        "ci_low": ab.get("ci_low"),
        "ci_high": ab.get("ci_high"),
        "edge": ab["edge"],
        "decision": ab["stop"].get("decision"),
        "reason": ab["stop"].get("reason", ""),
    }
