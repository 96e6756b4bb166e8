"""Conformance checks as pytest items (collected when ``--engine`` is given)."""

from __future__ import annotations

import pytest

from conformance.checks import plan
from conformance.pytest_plugin import settings_from_options
from conformance.session import SuiteSession


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "planned_check" in metafunc.fixturenames:
        settings = settings_from_options(metafunc.config)
        only = metafunc.config.getoption("--checks")
        checks = plan(settings, only.split(",") if only else None)
        metafunc.parametrize("planned_check", checks, ids=[c.id for c in checks])


@pytest.fixture(scope="session")
def conformance_session(request: pytest.FixtureRequest):
    session = SuiteSession(settings_from_options(request.config))
    yield session
    session.close()


def test_conformance(conformance_session: SuiteSession, planned_check) -> None:
    result = planned_check.run(conformance_session)
    if result.status == "skip":
        pytest.skip(result.message)
    if result.status == "fail":
        pytest.fail(result.message, pytrace=False)
