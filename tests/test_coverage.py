"""Coverage is a verdict: a run where a requested mode or check family did not run because of the engine
is incomplete (exit 7), in the CLI and the pytest route, unless the caller opts out with --allow-skip.

Each engine of ``ddtree_conformance.testing.coverage_engines`` exited 0 before (``scripts/coverage_holes.py``
on the unchanged suite: "0 passed, 0 failed, 17 skipped", "29 skipped", "11 passed, 4 skipped", ...); here
each exits 7 naming why. The reference engine on the same settings stays a pass (no false alarm), and so
does the tensor-parallel skip on one device.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ddtree_conformance.checks.result import CheckResult
from ddtree_conformance.cli import app
from ddtree_conformance.coverage import Entry, coverage, verdict
from ddtree_conformance.option_names import spelled_by

pytest_plugins = ["pytester"]

ENGINES = "ddtree_conformance.testing.coverage_engines"
PROMPTS = "".join(
    json.dumps({"id": f"p{i}", "category": "math", "prompt_ids": ids}) + "\n"
    for i, ids in enumerate([[1, 2, 3, 4], [5, 6, 7], [8, 9, 10, 11, 12]])
)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    from ddtree_conformance.testing.random_pair import write_random_pair

    root = tmp_path_factory.mktemp("coverage")
    target, drafter = write_random_pair(root / "pair")
    prompts = root / "p.jsonl"
    prompts.write_text(PROMPTS)
    return {"target": target, "drafter": drafter, "prompts": prompts, "golden": root / "golden"}


def check(inputs, tmp_path, engine: str, *args: str, fixture: bool = False):
    """``check`` on the random pair (``fixture``: the bundled pair, whose trained drafter makes a chain
    accept less than a tree)."""
    out = tmp_path / "check.json"
    pair = (
        []
        if fixture
        else [
            "--model",
            str(inputs["target"]),
            "--drafter",
            str(inputs["drafter"]),
            "--prompts",
            str(inputs["prompts"]),
            "--golden-dir",
            str(inputs["golden"]),
            "--pair-name",
            "random",
        ]
    )
    small = ["--max-new-tokens", "16", "--budgets", "16"] if fixture else ["--max-new-tokens", "6", "--budgets", "4"]
    argv = ["check", "--engine", engine, *pair, *small, "--modes", "ddtree", "--no-isolate", *args, "--out", str(out)]
    result = CliRunner().invoke(app, argv)
    report = json.loads(out.read_text()) if out.is_file() else None
    return result, report


@pytest.mark.parametrize(
    "engine, args, why, fixture",
    [
        (
            "NoDDTree",
            ["--limit", "1"],
            "DDTree not available in this engine: no ddtree check ran (engine does not offer "
            "mode ddtree); opt out with --allow-skip ddtree",
            False,
        ),
        ("PlainOnly", ["--limit", "1", "--modes", "dflash,ddtree"], "DFlash not available in this engine", False),
        (
            "ChainNoAcceptance",
            ["--limit", "2", "--check", "lossless", "--check", "acceptance", "--check", "tree-structure"],
            "acceptance did not run on 1 check(s) (engine reports neither per-round nor aggregate acceptance)",
            False,
        ),
        ("AggregateOnly", ["--limit", "3", "--check", "acceptance"], "the bootstrap band needs at least 5", True),
    ],
)
def test_an_engine_that_hides_from_checks_is_incomplete(inputs, tmp_path, engine, args, why, fixture):
    result, report = check(inputs, tmp_path, f"{ENGINES}:{engine}", *args, fixture=fixture)
    assert result.exit_code == 7, (result.output, result.exception)
    assert "error: run incomplete: " in result.stderr and why in result.stderr, result.stderr
    assert report["verdict"]["status"] == "incomplete" and why in report["verdict"]["reason"]
    assert report["counts"]["fail"] == 0  # nothing failed: the run is incomplete, not failed
    md = Path(tmp_path / "check.md").read_text()
    assert md.startswith("## INCOMPLETE: ") and "**Checks that did not pass**" in md
    assert '<div class="banner incomplete"' in Path(tmp_path / "check.html").read_text()


def test_the_chain_engine_names_every_family_it_hid_from(inputs, tmp_path):
    _, report = check(
        inputs,
        tmp_path,
        f"{ENGINES}:ChainNoAcceptance",
        "--limit",
        "2",
        "--check",
        "lossless",
        "--check",
        "acceptance",
        "--check",
        "tree-structure",
    )
    families = {f["family"]: f for f in report["coverage"]["families"]}
    assert families["lossless"]["status"] == "ran" and families["lossless"]["evidence"]["tokens"] > 0
    assert families["acceptance"]["status"] == families["tree-structure"]["status"] == "did not run"
    assert "tree-structure did not run" in report["verdict"]["reason"]
    assert "--allow-skip acceptance --allow-skip tree-structure" in report["verdict"]["reason"]


def test_allow_skip_opts_out_per_family_and_the_report_says_so(inputs, tmp_path):
    result, report = check(
        inputs,
        tmp_path,
        f"{ENGINES}:ChainNoAcceptance",
        "--limit",
        "2",
        "--check",
        "lossless",
        "--check",
        "acceptance",
        "--check",
        "tree-structure",
        "--allow-skip",
        "acceptance",
        "--allow-skip",
        "tree-structure",
    )
    assert result.exit_code == 0, (result.output, result.exception)
    assert (
        report["verdict"]["status"] == "pass"
        and "allowed to skip: acceptance, tree-structure" in report["verdict"]["reason"]
    )
    assert [g["family"] for g in report["coverage"]["allowed"]] == ["acceptance", "tree-structure"]
    assert "allowed to skip (--allow-skip): acceptance, tree-structure" in (tmp_path / "check.md").read_text()
    one, _ = check(inputs, tmp_path, f"{ENGINES}:NoDDTree", "--limit", "1", "--allow-skip", "ddtree")
    assert one.exit_code == 0, one.output


def test_an_unknown_allow_skip_name_is_a_usage_error(inputs, tmp_path):
    result, _ = check(inputs, tmp_path, "reference", "--allow-skip", "acceptanse")
    assert result.exit_code == 2
    assert "--allow-skip acceptanse: not a check family or mode" in result.stderr


def test_the_reference_engine_on_the_same_settings_is_complete(inputs, tmp_path):
    """No false alarm: the correct engine passes; golden (no file for these prompts: input) stays a plain
    skip and tensor-parallel (one device, no --tensor-parallel-size) is not applicable."""
    result, report = check(
        inputs,
        tmp_path,
        "reference",
        "--limit",
        "2",
        "--check",
        "lossless",
        "--check",
        "acceptance",
        "--check",
        "tree-structure",
        "--check",
        "golden",
        "--check",
        "tensor",
    )
    assert result.exit_code == 0, (result.output, result.exception)
    assert report["verdict"]["status"] == "pass" and report["coverage"]["complete"]
    causes = {r["check"].split("/")[0]: r.get("cause") for r in report["results"] if r["status"] == "skip"}
    assert causes == {"golden": "input", "tensor-parallel": "not-applicable"}
    families = {f["family"]: f for f in report["coverage"]["families"]}
    assert families["tensor-parallel"]["status"] == "not applicable" and families["tensor-parallel"]["not_applicable"]
    assert "1 not applicable on this run (tensor-parallel)" in report["verdict"]["reason"]
    assert report["engine"] == {
        "spec": "reference",
        "name": "reference",
        "version": __import__("ddtree_conformance").__version__,
    }


def test_the_pytest_route_of_an_engine_without_ddtree_is_incomplete(pytester, inputs):
    args = [
        "-p",
        "no:cacheprovider",
        "-q",
        "--ddtree-engine",
        f"{ENGINES}:NoDDTree",
        "--ddtree-modes",
        "ddtree",
        f"--ddtree-model={inputs['target']}",
        f"--ddtree-drafter={inputs['drafter']}",
        f"--ddtree-prompts={inputs['prompts']}",
        "--ddtree-limit",
        "1",
        "--ddtree-budgets",
        "4",
        "--ddtree-no-isolate",
        "--ddtree-report",
        "out/check.json",
    ]
    result = pytester.runpytest_inprocess(*args)
    assert result.ret == 7, result.stdout.str()
    result.assert_outcomes(skipped=17)  # the items keep their own skip reasons
    text = result.stdout.str()
    assert "INCOMPLETE (exit 7): DDTree not available in this engine" in text
    assert "--ddtree-allow-skip ddtree" in text
    report = json.loads((pytester.path / "out" / "check.json").read_text())
    assert report["verdict"]["status"] == "incomplete" and report["route"] == "pytest"
    assert (pytester.path / "out" / "check.md").is_file() and (pytester.path / "out" / "check.html").is_file()
    allowed = pytester.runpytest_inprocess(*args, "--ddtree-allow-skip", "ddtree")
    assert allowed.ret == 0, allowed.stdout.str()


def test_the_verdict_ranks_fail_above_incomplete():
    skip = CheckResult.skipped("acceptance/ddtree-B16", "no acceptance data")
    fail = CheckResult.failed("lossless/ddtree-B16", "differs")
    env = CheckResult.skipped("tensor-parallel/ddtree-B16", "one device", cause="environment")
    entries = [
        Entry("acceptance", "ddtree", skip),
        Entry("lossless", "ddtree", fail),
        Entry("tensor-parallel", "ddtree", env),
    ]
    assert verdict([e.result for e in entries], coverage(entries))["status"] == "fail"
    assert verdict([skip, env], coverage([entries[0], entries[2]]))["status"] == "incomplete"
    assert verdict([env], coverage([entries[2]]))["status"] == "pass"


# -- issue 31: not applicable is not incomplete; the suite's own advice runs as given ------------------------
def _stub(device: str, caps, tp: int = 1):
    from types import SimpleNamespace

    return SimpleNamespace(capabilities=caps, settings=SimpleNamespace(device=device, tensor_parallel_size=tp))


def _caps(**update):
    from ddtree_conformance.adapters.interface import Capabilities

    values = dict(
        name="e", modes=["plain", "dflash", "ddtree"], dtypes=["float32"], devices=["cpu", "cuda"], sampling=True
    )
    return Capabilities(**{**values, "traces": False, "per_round_acceptance": False, **update})


def test_cuda_graphs_without_the_capability_is_not_applicable_on_cpu_and_a_gap_on_cuda():
    """Before: "cuda-graphs did not run on 2 check(s) (engine cannot switch CUDA graphs per run
    (capabilities().cuda_graphs)); opt out with --allow-skip cuda-graphs": INCOMPLETE on a CPU run."""
    from ddtree_conformance.checks.cuda_graphs import check_cuda_graphs

    on_cpu = check_cuda_graphs(_stub("cpu", _caps()), "ddtree", 16)
    assert on_cpu.status == "skip" and on_cpu.cause == "not-applicable" and not on_cpu.applicable
    assert on_cpu.message.startswith("not applicable: a cpu run has no CUDA graphs")
    on_cuda = check_cuda_graphs(_stub("cuda", _caps()), "ddtree", 16)
    assert on_cuda.status == "skip" and on_cuda.cause == "engine"  # the family applies there: the engine's gap
    no_mode = check_cuda_graphs(_stub("cpu", _caps(modes=["plain"])), "ddtree", 16)
    assert no_mode.cause == "engine" and "does not offer mode ddtree" in no_mode.message


def test_tensor_parallel_on_one_device_is_not_applicable_and_an_engine_that_cannot_shard_is_a_gap(monkeypatch):
    from ddtree_conformance.checks import tensor_parallel as tp

    one = tp.check_tensor_parallel(_stub("cpu", _caps(max_tensor_parallel=2)), "ddtree", 16)
    assert one.cause == "not-applicable" and "1 cpu device(s) visible" in one.message
    assert tp.check_tensor_parallel(_stub("cuda", _caps()), "dflash", None).cause == "not-applicable"
    monkeypatch.setattr(tp, "visible_devices", lambda device: 2)  # two GPUs: the family applies
    gap = tp.check_tensor_parallel(_stub("cuda", _caps(max_tensor_parallel=1)), "ddtree", 16)
    assert gap.cause == "engine" and "max_tensor_parallel=1" in gap.message


def test_not_applicable_is_counted_shown_and_never_incomplete():
    na = CheckResult.not_applicable("cuda-graphs/ddtree-B16", "a cpu run has no CUDA graphs")
    gap = CheckResult.skipped("cuda-graphs/dflash", "engine does not offer mode dflash")
    ok = CheckResult.passed("lossless/ddtree-B16")
    entries = [Entry("cuda-graphs", "ddtree", na), Entry("lossless", "ddtree", ok)]
    cover = coverage(entries)
    assert cover.complete and not cover.gaps
    (row,) = [r for r in cover.rows if r.family == "cuda-graphs"]
    assert (row.not_applicable, row.skipped, row.status) == (1, 0, "not applicable")
    found = verdict([na, ok], cover)
    assert found["status"] == "pass", found  # its wording: test_the_reference_engine_on_the_same_settings_is_complete
    assert found["reason"].startswith("1 of 2 checks passed, 1 not applicable"), found
    assert found["reason"].endswith("(cuda-graphs)"), found
    # a mode is missing when every check of it that applies is a gap: the not-applicable one does not hide it
    dflash = [Entry("cuda-graphs", "dflash", na), Entry("lossless", "dflash", gap)]
    assert coverage(dflash).missing_modes == {"dflash": "engine does not offer mode dflash"}


def test_allow_skip_takes_every_family_and_mode_the_suite_can_plan():
    """Before: `--allow-skip branch-vs-chain` under --modes dflash (and near-ties in float32) was a usage error,
    exit 2: "not a check family or mode; known: acceptance, busy-batch, ..." without either name."""
    from ddtree_conformance.checks import FAMILIES, PER_MODE_CHECKS, plan
    from ddtree_conformance.coverage import check_allow_skip
    from ddtree_conformance.settings import SettingsError, SuiteSettings

    everything = {c.family for dtype in ("float32", "bfloat16") for c in plan(SuiteSettings(dtype=dtype))}
    assert everything == set(FAMILIES) and set(PER_MODE_CHECKS) < everything
    dflash = SuiteSettings(modes=["dflash"], allow_skip=[*FAMILIES, "dflash", "ddtree"], checks=["lossless"])
    notes = {n.split(" ", 1)[0]: n for n in check_allow_skip(dflash)}  # one note per name not planned
    assert notes["branch-vs-chain"] == "branch-vs-chain is not planned for --modes dflash"
    assert notes["ddtree"] == "ddtree is not planned for --modes dflash"
    assert notes["near-ties"].endswith(" not planned for --dtype float32 (bfloat16, float16)")
    assert notes["acceptance"].endswith(" not planned: --check lossless keeps none of its checks")
    assert "lossless" not in notes and "dflash" not in notes
    with pytest.raises(SettingsError) as refused, spelled_by("pytest"):  # as the pytest plugin spells options
        check_allow_skip(SuiteSettings(allow_skip=["branch-vs-chian"]))
    message = str(refused.value)
    assert message.startswith("--ddtree-allow-skip branch-vs-chian: ")  # the flag as given, the name
    assert "not a check family or mode; known: " in message
    assert all(name in message for name in [*FAMILIES, "dflash", "ddtree"])


ADVICE = re.compile(r"opt out with ((?:--(?:ddtree-)?allow-skip \S+ ?)+)")


def advice(text: str) -> list[str]:
    """The incomplete message's advice, as the arguments it names (taken literally)."""
    found = ADVICE.search(" ".join(text.split()))
    assert found, text
    return found.group(1).split()


@pytest.mark.parametrize(
    "engine, args",
    [
        ("NoDDTree", ["--limit", "1"]),
        ("PlainOnly", ["--limit", "1", "--modes", "dflash,ddtree", "--check", "lossless", "--check", "tree"]),
        ("ChainNoAcceptance", ["--limit", "1", "--check", "acceptance", "--check", "tree", "--check", "branch"]),
    ],
)
def test_the_incomplete_messages_advice_runs_as_given(inputs, tmp_path, engine, args):
    first, _ = check(inputs, tmp_path, f"{ENGINES}:{engine}", *args)
    assert first.exit_code == 7, first.output
    again, report = check(inputs, tmp_path, f"{ENGINES}:{engine}", *args, *advice(first.stderr))
    assert again.exit_code == 0, (again.output, again.exception)
    assert report["verdict"]["status"] == "pass" and "allowed to skip" in report["verdict"]["reason"]
