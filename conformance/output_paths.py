"""Where a command's output goes, fixed before the engine starts, and never onto a file the suite reads.

:func:`output_path` turns ``--out`` into an absolute path (so an engine that changes the working
folder, as one run with ``--no-isolate`` may, cannot move it), writes inside ``--out`` when it names
a folder (an existing one, or one still to be made: a path ending in ``/``), and refuses
(:class:`OutputPathError`, a usage error) a path one of whose files (a report's JSON, Markdown and
HTML) would be an input of the run: a golden file (``<golden folder>/<pair>/*.json``), a
file of the model or drafter folder, the prompts file, the pairs file, the calibration manifest
beside the model, the baselines, or anything in the suite's bundled data.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path

from .calibration import manifest_path
from .option_names import option
from .paths import GOLDEN_DIR
from .prompts import PromptError, resolve_prompt_set
from .report import report_paths
from .settings import SettingsError

__all__ = ["OutputPathError", "output_path", "protected_inputs"]


class OutputPathError(SettingsError):
    """``--out`` would overwrite an input of the run; the message names both."""


def protected_inputs(
    settings, *, pairs_file: str | Path | None = None, extra: Iterable[str | Path | None] = ()
) -> list[tuple[str, Path, str]]:
    """``(what, path, kind)`` of every input of a run with ``settings``. ``kind``: ``file`` (that file),
    ``tree`` (everything inside the folder) or ``golden`` (the golden files ``<folder>/<pair>/*.json``)."""
    inputs: list[tuple[str, Path | str | None, str]] = [
        ("a golden file", settings.golden_dir, "golden"),
        ("the model folder", settings.model_dir, "tree"),
        ("the drafter folder", settings.drafter_dir, "tree"),
        ("the calibration manifest", manifest_path(settings.model_dir), "file"),
        ("the suite's bundled data", GOLDEN_DIR, "tree"),
        ("the pairs file", pairs_file, "file"),
    ]
    try:
        inputs.append(("the prompts file", resolve_prompt_set(settings.prompt_set), "file"))
    except PromptError:
        pass
    inputs += [("an input of this command", path, "tree") for path in extra]
    return [(what, Path(path).expanduser().resolve(), kind) for what, path, kind in inputs if path is not None]


def _overwrites(target: Path, source: Path, kind: str) -> bool:
    if kind == "golden":
        return target.suffix == ".json" and target.parent.parent == source
    if kind == "tree":
        return target == source or source in target.parents
    return target == source


def output_path(
    out: str | Path | None,
    default: Path,
    settings,
    *,
    option_name: str = "out",
    files: Callable[[Path], Iterable[Path]] = report_paths,
    pairs_file: str | Path | None = None,
    extra: Iterable[str | Path | None] = (),
) -> Path:
    """The absolute path a command writes to (module doc). ``default``: the path without ``--out`` (its
    name is also the file name inside an ``--out`` folder); ``files``: every file written for a path
    (a report's JSON, Markdown and HTML by default)."""
    flag = option(option_name)
    if out is None:
        path = Path(default)
    else:
        path = Path(out).expanduser()
        folder = str(out).endswith(("/", os.sep))  # `--out newdir/`: a folder, made when the report is written
        if folder and path.exists() and not path.is_dir():
            raise OutputPathError(f"{flag} {out}: {path} is a file, not a folder")
        if path.is_dir() or folder:
            path = path / Path(default).name
    path = path.absolute()
    for target in [path, *files(path)]:  # the path named, and every file written for it
        target = Path(target).resolve()
        if target.is_dir():
            raise OutputPathError(f"{flag} {out}: {target} is a folder")
        for what, source, kind in protected_inputs(settings, pairs_file=pairs_file, extra=extra):
            if _overwrites(target, source, kind):
                shown = "" if target == source else f" ({target} is inside {source})"
                raise OutputPathError(
                    f"{flag} {out}: the output {target} would overwrite {what}{shown}; the suite "
                    f"reads it. Name a path outside the run's inputs"
                )
    return path
