"""adapters/options.py: every bad engine option or model directory gives one error naming it."""

from __future__ import annotations

import json

import pytest

from ddtree_conformance.adapters import options as opts
from ddtree_conformance.adapters.interface import EngineError


def test_unknown_options_listed():
    from ddtree_conformance.adapters.interface import UnknownOption

    with pytest.raises(UnknownOption, match=r"engine 'x': unknown option\(s\) colour; known: seed, size"):
        opts.check_known("x", {"colour": 1, "seed": 2}, ["seed", "size"])
    with pytest.raises(UnknownOption, match=r"known: none \(this engine takes no options\)"):
        opts.check_known("x", {"colour": 1}, [])


@pytest.mark.parametrize("value,want", [(True, True), ("on", True), ("1", True), ("No", False), (0, False)])
def test_flag(value, want):
    assert opts.flag("x", "eager", value) is want


@pytest.mark.parametrize(
    "call,needle",
    [
        (lambda: opts.flag("x", "eager", "maybe"), "option eager must be true or false, got 'maybe'"),
        (lambda: opts.number("x", "seed", "abc"), "option seed must be int, got 'abc'"),
        (lambda: opts.number("x", "frac", 1.5, float, 0.0, 1.0), "option frac must be in [0.0, 1.0], got 1.5"),
        (lambda: opts.number("x", "len", 0, int, 1), "option len must be >= 1, got 0"),
        (lambda: opts.choice("x", "scope", "all", ("batch", "request")), "option scope must be one of batch, request"),
    ],
)
def test_bad_values_named(call, needle):
    with pytest.raises(EngineError) as err:
        call()
    assert needle in str(err.value) and "engine 'x'" in str(err.value)


def test_configs(tmp_path):
    with pytest.raises(EngineError, match="cannot read the target config .*config.json"):
        opts.read_config("x", str(tmp_path), "target")
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(EngineError, match="is not a JSON object"):
        opts.read_config("x", str(tmp_path), "target")
    for bad in (1, True, "16", None):
        (tmp_path / "config.json").write_text(json.dumps({"block_size": bad}))
        with pytest.raises(EngineError, match="block_size must be an int >= 2"):
            opts.drafter_block_size("x", str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"block_size": 16}))
    assert opts.drafter_block_size("x", str(tmp_path)) == 16


def test_cuda_device_count_is_an_int():
    assert isinstance(opts.cuda_device_count(), int)
