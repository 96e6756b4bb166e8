"""Conformance checks as pytest items (collected when ``--ddtree-engine`` is given)."""

from __future__ import annotations

import pytest

from ddtree_conformance.checks import plan
from ddtree_conformance.pytest_plugin import item_group, settings_from_options
from ddtree_conformance.session import SuiteSession


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "planned_check" in metafunc.fixturenames:
        settings = settings_from_options(metafunc.config)
        group = item_group(settings)
        checks = plan(settings)
        metafunc.parametrize("planned_check", checks, ids=[f"{group}|{c.id}" for c in checks])


@pytest.fixture(scope="session")
def conformance_session(request: pytest.FixtureRequest):
    session = SuiteSession(settings_from_options(request.config))
    yield session
    session.close()


@pytest.fixture
def junit_class(request: pytest.FixtureRequest, record_xml_attribute) -> None:
    """JUnit ``classname`` = ``ddtree.<engine>-<dtype>-<pair>``: two engines' reports never collide."""
    record_xml_attribute("classname", "ddtree." + item_group(settings_from_options(request.config)))


@pytest.mark.filterwarnings("ignore::pytest.PytestExperimentalApiWarning")
def test_conformance(conformance_session: SuiteSession, planned_check, junit_class) -> None:
    result = planned_check.run(conformance_session)
    if result.status == "skip":
        pytest.skip(result.message)
    if result.status == "fail":
        pytest.fail(result.message, pytrace=False)
