"""Conformance checks as pytest items (collected when ``--ddtree-engine`` is given).

Before the first check, the session refuses settings the engine cannot run here (a budget above
its ``max_budget``, a dtype or device it lacks) and unknown engine options: every item then fails
with that one line. An engine that cannot start or dies fails the item it happened in, with the
engine's log tail; every later item fails at once with one line naming the cause (the engine is
not restarted).
"""

from __future__ import annotations

import pytest

from ddtree_conformance.adapters.interface import EngineDied, EngineUsageError
from ddtree_conformance.check_report import engine_identity
from ddtree_conformance.checks import plan
from ddtree_conformance.oracle import hold as hold_oracle
from ddtree_conformance.pytest_plugin import item_group, settings_from_options
from ddtree_conformance.pytest_results import RESULT_KEY, SESSION_KEY
from ddtree_conformance.session import SuiteSession
from ddtree_conformance.session.run_metrics import runs_from_session
from ddtree_conformance.settings import SettingsError


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "planned_check" in metafunc.fixturenames:
        settings = settings_from_options(metafunc.config)
        group = item_group(settings)
        checks = plan(settings)
        metafunc.parametrize("planned_check", checks, ids=[f"{group}|{c.id}" for c in checks])


@pytest.fixture(scope="session")
def conformance_session(request: pytest.FixtureRequest):
    session = SuiteSession(settings_from_options(request.config))
    hold_oracle(session)  # golden records, manifest and calibration held before the engine starts
    yield session
    held_out = [{"id": p.id, "prompt_ids": p.prompt_ids} for p in session.inputs.drawn_held_out()]
    info = {"runs": [], "engine": engine_identity(session), "held_out_prompts": held_out}
    try:  # the run metrics, the engine's identity, the held-out prompts: the check report (pytest_results.Recorder)
        info["runs"] = runs_from_session(session)
    except Exception:  # a dead engine leaves partial runs: the report keeps the checks' results
        pass
    finally:
        request.config.stash[SESSION_KEY] = info
        session.close()


@pytest.fixture
def junit_class(request: pytest.FixtureRequest, record_xml_attribute) -> None:
    """JUnit ``classname`` = ``ddtree.<engine>-<dtype>-<pair>``: two engines' reports never collide."""
    record_xml_attribute("classname", "ddtree." + item_group(settings_from_options(request.config)))


def _engine_failure(session: SuiteSession, exc: EngineDied) -> str:
    """One line naming the cause; the first report of a failure also shows the engine's log tail."""
    line = " ".join(str(exc).split("\n", 1)[0].split())
    if session.engines.failure_reported or not exc.log_tail.strip():
        return line
    session.engines.failure_reported = True
    return f"{line}\n--- engine log tail ---\n{exc.log_tail}"


@pytest.mark.filterwarnings("ignore::pytest.PytestExperimentalApiWarning")
@pytest.mark.filterwarnings("ignore:record_xml_attribute is incompatible")  # the class name is set all the same
def test_conformance(conformance_session: SuiteSession, planned_check, junit_class, request) -> None:
    failure = None  # pytest.fail outside the except blocks: no chained exceptions in the report
    try:
        conformance_session.require_support()
        result = planned_check.run(conformance_session)
        request.node.stash[RESULT_KEY] = result
    except (SettingsError, EngineUsageError) as exc:
        failure = f"ddtree-conformance: {exc}"
    except EngineDied as exc:
        failure = _engine_failure(conformance_session, exc)
    if failure is not None:
        pytest.fail(failure, pytrace=False)
    if result.status == "skip":
        pytest.skip(result.message)
    if result.status == "fail":
        pytest.fail(result.message, pytrace=False)
