"""Issue 30: options are spelled in one place (conformance/option_names.py); every other module names an
option by its field and the front end running decides the spelling."""

from __future__ import annotations

import pytest

from ddtree_conformance.checks import plan
from ddtree_conformance.option_names import COMMAND_FLAGS, OPTION_FLAGS, command, option, pytest_flag, spelled_by
from ddtree_conformance.settings import SettingsError, SuiteSettings, build_settings
from ddtree_conformance.support import unsupported_settings


def test_an_option_reads_as_the_front_end_running_spells_it():
    assert option("max_new_tokens") == "--max-new-tokens"  # the CLI's, when no front end says otherwise
    with spelled_by("pytest"):
        assert option("max_new_tokens") == "--ddtree-max-new-tokens" == pytest_flag("max_new_tokens")
        assert option("update") == "--update"  # a CLI command's option reads the same everywhere
        with spelled_by("cli"):
            assert option("checks") == "--check"
        assert option("checks") == "--ddtree-check"
    assert option("checks") == "--check"
    assert option("not_an_option") == "not_an_option"  # a field without an option: its name
    assert command("bench", "against", "baselines") == "`bench --against --baselines`"
    assert not set(OPTION_FLAGS) & set(COMMAND_FLAGS)


@pytest.mark.parametrize("front_end, flag", [("cli", "--check"), ("pytest", "--ddtree-check")])
def test_domain_errors_name_the_option_as_the_front_end_spells_it(front_end, flag):
    """A settings error, a plan that keeps nothing and an engine that cannot run a dtype: each names the
    option the user typed in that front end."""
    with spelled_by(front_end):
        with pytest.raises(SettingsError, match=f"^{flag} nosuch keeps none"):
            plan(SuiteSettings(checks=["nosuch"]))
        with pytest.raises(SettingsError, match=f"^{flag.replace('check', 'limit')}: "):
            build_settings({"limit": 0})

        class Caps:
            name, dtypes, devices, modes, max_tensor_parallel, max_budget = (
                "e",
                ["float32"],
                ["cpu"],
                ["plain"],
                1,
                None,
            )

        problem = unsupported_settings(Caps(), SuiteSettings(dtype="bfloat16"))
        assert problem.startswith(f"{flag.replace('check', 'dtype')} bfloat16: engine 'e' supports float32"), problem
