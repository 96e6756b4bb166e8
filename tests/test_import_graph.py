"""The layout holds: the spec on the ground floor, adapters above it, the rest of the suite on top.

Every module under ``conformance/`` and ``adapters/`` is parsed with :mod:`ast` (nothing is
imported), its imports are resolved to ``ddtree_conformance.*`` names (relative imports included),
and the layers are checked:

    spec  <-  adapters.interface  <-  adapters.*  <-  the rest of ddtree_conformance

A module may import its own layer and the layers below it, never one above. Also: no module in those
folders is over ``MAX_LINES`` lines, no file of the project points into ``../shared`` (the project stands
alone), and production code imports no test double: only ``conformance/testing/`` itself (and the tests and
scripts, which are not parsed here) may import ``ddtree_conformance.testing``.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from ddtree_conformance.testing.imports import BARE, PACKAGE, SOURCES, module_name, project_imports

ROOT = Path(__file__).resolve().parent.parent
MAX_LINES = 480  # ruff-formatted lines (the compact hand style held its modules under 400)
LAYERS = ["spec", "adapters.interface", "adapters", "suite"]  # bottom to top


def layer(module: str) -> str:
    if module == f"{PACKAGE}.spec" or module.startswith(f"{PACKAGE}.spec."):
        return "spec"
    if module == f"{PACKAGE}.adapters.interface" or module.startswith(f"{PACKAGE}.adapters.interface."):
        return "adapters.interface"
    if module == f"{PACKAGE}.adapters" or module.startswith(f"{PACKAGE}.adapters."):
        return "adapters"
    return "suite"


def source_files(root: Path = ROOT) -> list[Path]:
    return sorted(p for folder in SOURCES for p in (root / folder).rglob("*.py") if "__pycache__" not in p.parts)


def _label(path: Path, root: Path = ROOT) -> str:
    return path.relative_to(root).as_posix()


def layering_violations(root: Path = ROOT) -> list[str]:
    problems = []
    for path in source_files(root):
        module, _ = module_name(path, root)
        own = LAYERS.index(layer(module))
        for line, target in project_imports(path, root):
            if target.split(".")[0] in BARE:
                problems.append(f"{_label(path, root)}:{line} imports bare {target!r} (the import name is {PACKAGE})")
            elif target.startswith("."):
                problems.append(f"{_label(path, root)}:{line} relative import {target!r} leaves the package")
            elif LAYERS.index(layer(target)) > own:
                problems.append(
                    f"{_label(path, root)}:{line} ({layer(module)}) imports {target} ({layer(target)}), "
                    f"a layer above it"
                )
    return problems


def test_the_sources_are_found():
    assert len(source_files()) > 50
    assert {module_name(p, ROOT)[0] for p in source_files()} >= {
        f"{PACKAGE}.spec.tree",
        f"{PACKAGE}.adapters.interface",
        f"{PACKAGE}.checks",
        f"{PACKAGE}.cli.base",
    }


def test_the_spec_imports_nothing_of_the_project():
    spec_files = [p for p in source_files() if layer(module_name(p, ROOT)[0]) == "spec"]
    assert len(spec_files) >= 5
    outside = [
        f"{_label(p)}:{line} imports {target}"
        for p in spec_files
        for line, target in project_imports(p, ROOT)
        if layer(target) != "spec" or target.startswith(".")
    ]
    assert not outside, "the spec must stand on the ground floor:\n" + "\n".join(outside)


def test_layers_only_import_downwards():
    problems = layering_violations()
    assert not problems, "\n".join(problems)


def test_adapters_interface_imports_only_the_spec():
    interface = ROOT / "adapters" / "interface.py"
    assert all(layer(t) == "spec" for _, t in project_imports(interface, ROOT)), project_imports(interface, ROOT)


def test_the_layer_check_can_fail(tmp_path):
    """Imports that break the layering, in a throw-away tree, are each reported."""
    files = {
        "conformance/spec/tree.py": "from ..settings import SuiteSettings\n",  # the spec reaching up
        "conformance/spec/walk.py": "from .tree import x\nimport numpy\n",  # fine
        "adapters/engine.py": "from ddtree_conformance.checks import plan\nfrom .interface import Engine\n",
        "adapters/interface.py": "from .registry import EngineRegistry\n",  # interface above adapters
        "conformance/cli.py": "import adapters.interface\n",  # a bare top-level name
        "conformance/report.py": "from .adapters.interface import Engine\nfrom .spec import tree\n",  # fine
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    problems = layering_violations(tmp_path)
    assert [p.split(" ", 1)[0] for p in problems] == [
        "adapters/engine.py:1",
        "adapters/interface.py:1",
        "conformance/cli.py:1",
        "conformance/spec/tree.py:1",
    ]
    assert "imports ddtree_conformance.settings (suite)" in problems[-1]
    assert "imports bare 'adapters.interface'" in problems[2]


TESTING = f"{PACKAGE}.testing"


def imports_of_test_doubles(root: Path = ROOT) -> list[str]:
    """Imports of the test doubles (``ddtree_conformance.testing``, function-local ones included) by a
    module outside ``conformance/testing/``."""
    problems = []
    for path in source_files(root):
        module, _ = module_name(path, root)
        if module == TESTING or module.startswith(TESTING + "."):
            continue
        for line, target in project_imports(path, root):
            if target == TESTING or target.startswith(TESTING + "."):
                problems.append(f"{_label(path, root)}:{line} ({module}) imports the test double {target}")
    return problems


def test_production_code_imports_no_test_doubles():
    """The suite a user installs runs without its test doubles: what production needs of them lives in a
    production module (``xdist_gpus``, ``drafter_config``)."""
    problems = imports_of_test_doubles()
    assert not problems, "move what production needs out of conformance/testing/:\n" + "\n".join(problems)


def test_the_test_double_check_can_fail(tmp_path):
    files = {
        "conformance/pytest_plugin.py": "from .testing.xdist_gpus import XdistGpuPlugin\n",
        "conformance/synthetic.py": "def f():\n    from ddtree_conformance.testing.random_pair import x\n",
        "conformance/checks/lossless.py": "from ..testing import mutants\n",
        "adapters/engine.py": "import ddtree_conformance.testing\n",
        "conformance/testing/mutants.py": "from .random_pair import write_random_pair\n",  # fine: a double
        "conformance/testing/tiers.py": "from ddtree_conformance.testing.mutants import MUTANTS\n",  # fine
        "conformance/report.py": "from .testing_notes import x\n",  # fine: another module
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert [p.split(" ", 1)[0] for p in imports_of_test_doubles(tmp_path)] == [
        "adapters/engine.py:1",
        "conformance/checks/lossless.py:1",
        "conformance/pytest_plugin.py:1",
        "conformance/synthetic.py:2",
    ]


def import_cycles(root: Path = ROOT) -> list[list[str]]:
    """Every cycle of the import graph (function-local imports included), as module lists; one per
    strongly connected set of modules, found by depth-first search."""
    modules = {module_name(p, root)[0]: p for p in source_files(root)}
    edges: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        for _, target in project_imports(path, root):
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != module:
                edges[module].add(target)
    cycles, state = [], {}  # state: 1 on the stack, 2 done

    def visit(module: str, stack: list[str]) -> None:
        state[module] = 1
        stack.append(module)
        for target in sorted(edges[module]):
            if state.get(target) == 1:
                cycles.append(stack[stack.index(target) :] + [target])
            elif target not in state:
                visit(target, stack)
        stack.pop()
        state[module] = 2

    for module in sorted(modules):
        if module not in state:
            visit(module, [])
    return cycles


def test_no_import_cycles():
    """No module reaches itself through imports, function-local ones included: calibration is derived
    and loaded in ``calibration``, measured in ``calibrate``, and the verdict modules (``replay``,
    ``token_scoring``) import calibration, never the reverse."""
    cycles = import_cycles()
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_the_cycle_check_can_fail(tmp_path):
    files = {
        "conformance/calibration.py": "def load():\n    from .replay import measure\n",
        "conformance/replay.py": "from .calibration import load\n",
        "conformance/token_scoring.py": "from .calibration import load\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    (tmp_path / "adapters").mkdir()
    assert import_cycles(tmp_path) == [[f"{PACKAGE}.calibration", f"{PACKAGE}.replay", f"{PACKAGE}.calibration"]]


def test_no_module_over_the_line_limit():
    long = {_label(p): n for p in source_files() if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (split them by concept): {long}"


def _project_files() -> list[Path]:
    """The project's files: what git tracks (plus untracked, unignored ones); a walk without git."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout.split("\0")
        return [ROOT / name for name in listed if name and (ROOT / name).is_file()]
    except (OSError, subprocess.SubprocessError):
        skip = {".git", ".venv", ".venv-vllm", ".venv-sglang", "node", "__pycache__", ".tox", "build", "dist"}
        return [
            p
            for p in ROOT.rglob("*")
            if p.is_file()
            and not skip & set(p.relative_to(ROOT).parts)
            and not any(part.endswith(".egg-info") for part in p.parts)
        ]


def test_nothing_points_into_shared():
    needles = ("../shared", "/work/shared", "shared/docs/")
    hits = []
    for path in _project_files():
        if path.suffix in (".safetensors", ".png", ".whl", ".gz") or path.stat().st_size > 5_000_000:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        if path == Path(__file__).resolve():
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if any(n in line for n in needles):
                hits.append(f"{_label(path)}:{number}: {line.strip()[:120]}")
    assert not hits, "the project must stand alone; these point outside it:\n" + "\n".join(hits)


@pytest.mark.parametrize("name", BARE)
def test_no_bare_top_level_package_is_importable_from_elsewhere(name, tmp_path):
    """From a folder outside the repository, the bare names are not this project's packages."""
    import sys

    code = f"import importlib.util; s = importlib.util.find_spec({name!r}); print(s.origin if s else None)"
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},
    )
    origin = out.stdout.strip()
    assert origin == "None" or not Path(origin).resolve().is_relative_to(ROOT), origin


def family_cross_imports(root: Path = ROOT, family_modules: set[str] | None = None) -> list[str]:
    """Imports of one check family's module by another's: families sit on one floor, and what they share
    (output comparison, per-round acceptance, the traced run, the stop rules) on a floor below them."""
    from ddtree_conformance.checks.families import DECLARED

    modules = family_modules if family_modules is not None else {f.check.__module__ for f in DECLARED}
    problems = []
    for path in source_files(root):
        module, _ = module_name(path, root)
        if module not in modules:
            continue
        for line, target in project_imports(path, root):
            if target in modules and target != module:
                problems.append(f"{_label(path, root)}:{line} (family) imports {target} (another family)")
    return problems


def test_check_families_import_no_other_family():
    problems = family_cross_imports()
    assert not problems, "\n".join(problems)


def test_the_family_floor_check_can_fail(tmp_path):
    (tmp_path / "conformance" / "checks").mkdir(parents=True)
    (tmp_path / "conformance" / "checks" / "a.py").write_text("from .b import check_b\nfrom .shared import x\n")
    (tmp_path / "conformance" / "checks" / "b.py").write_text("from .shared import x\n")
    families = {f"{PACKAGE}.checks.a", f"{PACKAGE}.checks.b"}
    problems = family_cross_imports(tmp_path, families)
    assert [p.split(" ", 1)[0] for p in problems] == ["conformance/checks/a.py:1"], problems
