"""Golden files: greedy outputs, top-2 gaps and acceptance traces for (pair, prompt set, dtype).

One JSON file per key at ``<golden_dir>/<pair>/<prompt_set>-<dtype>.json``; :func:`golden_path`
refuses a pair name, prompt-set name or dtype that would put it anywhere else. Files are written
atomically and durably (:func:`ddtree_conformance.files.atomic_write`) and never overwritten unless
asked; an update returns a readable diff of what changed, refuses to drop records, budgets or
output tokens the file holds unless ``replace`` (:func:`golden_losses`), and replaces an unreadable
file with a warning naming it. A file that cannot be read (not UTF-8, not JSON, wrong fields) is one
:class:`GoldenError` naming the file.
"""

from __future__ import annotations

import platform
import re
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

from pydantic import BaseModel, Field, ValidationError

from . import __version__
from .files import atomic_write, parse_json_object, read_json_object
from .metrics import mean_tau
from .option_names import option
from .run import Run

__all__ = [
    "SCHEMA_VERSION",
    "GoldenRecord",
    "GoldenFile",
    "GoldenError",
    "GoldenExists",
    "golden_lengths",
    "golden_path",
    "load_golden",
    "parse_golden",
    "write_golden",
    "diff_golden",
    "golden_losses",
    "record_golden",
]

SCHEMA_VERSION = 1


class GoldenError(ValueError):
    """A golden file cannot be read; the message names the file and the field."""


class GoldenExists(GoldenError):
    """Refusing to overwrite a golden file without ``update``."""


class GoldenRecord(BaseModel):
    prompt_ids: list[int]
    output_ids: list[int] = Field(description="plain greedy output")
    top2_gaps: list[float] = Field(description="target top-1 minus top-2 logit at each output position")
    acceptance: dict[str, list[int]] = Field(
        default_factory=dict, description="per-round acceptance lengths by mode key: dflash, ddtree-<B>"
    )


class GoldenFile(BaseModel):
    schema_version: int = SCHEMA_VERSION
    pair: str
    prompt_set: str
    dtype: str
    max_new_tokens: int
    versions: dict[str, str] = Field(default_factory=dict)
    records: dict[str, GoldenRecord]


def golden_lengths(lengths: Sequence[int], max_new_tokens: int) -> list[int]:
    """The rounds of a longer reference run (a record's ``acceptance``) that a run limited to
    ``max_new_tokens`` makes (greedy runs with a smaller limit are prefixes of longer ones)."""
    kept, emitted = [], 1
    for length in lengths:
        if emitted >= max_new_tokens:
            break
        kept.append(length)
        emitted += length
    return kept


_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def _warn(message: str) -> None:
    warnings.warn(message, stacklevel=3)


def golden_path(golden_dir: str | Path, pair: str, prompt_set: str, dtype: str) -> Path:
    """``<golden_dir>/<pair>/<prompt set stem>-<dtype>.json``; a :class:`GoldenError` for names that
    would leave ``<golden_dir>/<pair>/`` (``../x``, ``a/b``, absolute paths)."""
    stem = Path(str(prompt_set)).stem  # a file name: no separators left
    for what, value in (("pair name", pair), ("dtype", dtype)):
        if not isinstance(value, str) or not _NAME.fullmatch(value) or ".." in value:
            raise GoldenError(
                f"{what} {value!r} cannot name a golden file under {golden_dir} (letters, digits, "
                "'.', '_', '-'; no '..')"
            )
    if not stem.strip():
        raise GoldenError(f"prompt set {prompt_set!r} has no name to key a golden file by")
    folder = Path(golden_dir) / pair
    path = folder / f"{stem}-{dtype}.json"
    if path.resolve().parent != folder.resolve():  # belt and braces: no name above gets here
        raise GoldenError(f"golden file {path} would not be inside {folder}")
    return path


def load_golden(golden_dir: str | Path, pair: str, prompt_set: str, dtype: str) -> GoldenFile | None:
    path = golden_path(golden_dir, pair, prompt_set, dtype)
    if not path.is_file():
        return None
    return _golden(read_json_object(path, GoldenError, "golden file"), path)


def parse_golden(raw: bytes, path: str | Path) -> GoldenFile:
    """The golden file whose bytes ``raw`` were read from ``path`` (a copy held in memory)."""
    return _golden(parse_json_object(raw, path, GoldenError, "golden file"), Path(path))


def _golden(data: dict, path: Path) -> GoldenFile:
    if data.get("schema_version") != SCHEMA_VERSION:
        raise GoldenError(f"{path}: schema_version {data.get('schema_version')!r}, this suite reads {SCHEMA_VERSION}")
    try:
        return GoldenFile(**data)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise GoldenError(f"{path}: field {'.'.join(map(str, err['loc']))}: {err['msg']}") from None


def diff_golden(old: GoldenFile | None, new: GoldenFile) -> list[str]:
    """Readable lines describing how ``new`` differs from ``old``."""
    if old is None:
        return [f"new golden file: {len(new.records)} prompts"]
    lines: list[str] = []
    for key in ("max_new_tokens", "versions"):
        if getattr(old, key) != getattr(new, key):
            lines.append(f"{key}: {getattr(old, key)} -> {getattr(new, key)}")
    for pid in sorted(set(old.records) - set(new.records)):
        lines.append(f"- prompt {pid} removed")
    for pid in sorted(set(new.records) - set(old.records)):
        lines.append(f"+ prompt {pid} added")
    for pid in sorted(set(old.records) & set(new.records)):
        a, b = old.records[pid], new.records[pid]
        if a.output_ids != b.output_ids:
            pos = next(
                (i for i, (x, y) in enumerate(zip(a.output_ids, b.output_ids)) if x != y),
                min(len(a.output_ids), len(b.output_ids)),
            )
            lines.append(
                f"~ {pid}: output changes at token {pos}: "
                f"{a.output_ids[pos : pos + 5]} -> {b.output_ids[pos : pos + 5]}"
            )
        for key in sorted(set(a.acceptance) | set(b.acceptance)):
            if a.acceptance.get(key) != b.acceptance.get(key):
                old_tau = mean_tau([a.acceptance.get(key, [])])
                new_tau = mean_tau([b.acceptance.get(key, [])])
                lines.append(f"~ {pid}: {key} acceptance changes, tau {old_tau:.3f} -> {new_tau:.3f}")
    old_taus = {k: mean_tau([r.acceptance.get(k, []) for r in old.records.values()]) for k in _keys(old)}
    new_taus = {k: mean_tau([r.acceptance.get(k, []) for r in new.records.values()]) for k in _keys(new)}
    for key in sorted(set(old_taus) | set(new_taus)):
        if old_taus.get(key) != new_taus.get(key):
            lines.append(f"  overall {key} tau: {old_taus.get(key, 0):.3f} -> {new_taus.get(key, 0):.3f}")
    return lines or ["no changes"]


def _keys(golden: GoldenFile) -> set[str]:
    return {k for r in golden.records.values() for k in r.acceptance}


def golden_losses(old: GoldenFile, prompt_ids, keys, max_new_tokens: int) -> list[str]:
    """What replacing ``old`` by a file of ``prompt_ids``, acceptance ``keys`` and ``max_new_tokens``
    would drop: records, budgets (acceptance keys) or output tokens; empty when nothing."""
    losses = []
    gone = [pid for pid in old.records if pid not in set(prompt_ids)]
    if gone:
        shown = ", ".join(gone[:5]) + (", ..." if len(gone) > 5 else "")
        losses.append(f"{len(gone)} of {len(old.records)} records ({shown})")
    lost_keys = sorted(_keys(old) - set(keys))
    if lost_keys:
        losses.append(f"acceptance of {', '.join(lost_keys)}")
    if max_new_tokens < old.max_new_tokens:
        losses.append(f"output tokens past {max_new_tokens} (the file holds {old.max_new_tokens} per prompt)")
    return losses


def write_golden(
    golden_dir: str | Path,
    golden: GoldenFile,
    *,
    update: bool = False,
    replace: bool = False,
    warn: Callable[[str], None] | None = None,
) -> tuple[Path, list[str]]:
    """Write atomically; refuse to replace an existing file unless ``update`` (or ``replace``), and to drop
    what it holds (:func:`golden_losses`) unless ``replace``. Returns the diff.

    With ``update``, an existing file that cannot be read is replaced, with a warning naming it."""
    path = golden_path(golden_dir, golden.pair, golden.prompt_set, golden.dtype)
    if path.exists() and not (update or replace):
        raise GoldenExists(f"{path} exists; pass {option('update')} to replace it (a diff will be shown)")
    old = None
    if path.exists():
        try:
            old = load_golden(golden_dir, golden.pair, golden.prompt_set, golden.dtype)
        except GoldenError as exc:
            (warn or _warn)(f"replacing an unreadable golden file: {exc}")
    losses = [] if old is None or replace else golden_losses(old, golden.records, _keys(golden), golden.max_new_tokens)
    if losses:
        raise GoldenExists(refusal(path, losses))
    diff = diff_golden(old, golden)
    atomic_write(path, golden.model_dump_json(indent=1) + "\n", warn=warn)
    return path, diff


def refusal(path: Path, losses: list[str]) -> str:
    return (
        f"{path}: the update would drop {'; '.join(losses)}; record with the file's prompts, budgets and "
        f"{option('max_new_tokens')}, or pass {option('replace')} to drop them"
    )


def record_golden(session, budgets: list[int], progress=None) -> GoldenFile:
    """Run the session's engine (normally the reference) in plain, dflash and ddtree at ``budgets``."""
    import torch  # heavy: only recording needs them
    import transformers

    s = session.settings
    plain = session.plain()
    for prompt, result in zip(session.prompts, plain):
        if result.error:
            raise GoldenError(f"cannot record: plain run failed on {prompt.id}: {result.error.splitlines()[0]}")
    records = {
        p.id: GoldenRecord(
            prompt_ids=p.prompt_ids,
            output_ids=r.output_ids,
            top2_gaps=[round(g, 6) for g in session.scorer.gaps(p.prompt_ids, r.output_ids)],
        )
        for p, r in zip(session.prompts, plain)
    }
    for run in [Run("dflash")] + [Run("ddtree", b) for b in budgets]:
        if run.mode not in session.capabilities.modes:
            continue
        key = run.golden_key
        for prompt, result in zip(session.prompts, session.run(run.mode, run.budget)):
            if result.acceptance_lengths is not None:
                records[prompt.id].acceptance[key] = result.acceptance_lengths
        if progress:
            progress(key)
    caps = session.capabilities
    return GoldenFile(
        pair=s.pair_name,
        prompt_set=Path(s.prompt_set).stem,
        dtype=s.dtype,
        max_new_tokens=s.max_new_tokens,
        versions={
            "ddtree_conformance": __version__,
            "engine": f"{caps.name} {caps.version}",
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "device": s.device,
            "machine": platform.machine(),
        },
        records=records,
    )
