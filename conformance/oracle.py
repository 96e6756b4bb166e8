"""The oracle's files, held out of the engine's reach.

An engine under test runs on the same machine as the suite and can write where the suite reads.
So the files verdicts rest on are read, hashed and held in memory once per session, before the
engine starts (:func:`hold`; the CLI and the pytest route call it before anything starts the
engine, and every planned check calls it first):

* the golden files the plan may read: float32, the run's dtype, and the run's dtype on its device
  kind (a file that is absent is held as absent: one that appears later is not read);
* the pair manifest (``<pair dir>/MANIFEST.json``) and the low-precision calibration derived from it.

Verdicts read that copy (:func:`oracle_for`), never the disk. The target's and drafter's configs
(by hash) and weights (by size, modification time and inode) are watched too, since the fp32 scorer
loads them; a weights file rewritten with its old size and modification time restored would not
be seen. After every check :func:`changed_on_disk` compares the disk with the copy: a
change fails that check, and every later one, naming the file (the runner does this,
:mod:`ddtree_conformance.checks.runner`).
"""

from __future__ import annotations

import hashlib
import weakref
from dataclasses import dataclass
from pathlib import Path

from .calibration import CalibrationError, calibration_from_manifest, manifest_path
from .golden_files import GoldenError, GoldenFile, golden_path, parse_golden
from .noise import NoiseModel
from .token_scoring import hold_rules

__all__ = ["HeldFile", "OracleCopy", "hold", "oracle_for", "changed_on_disk"]

HASHED_UP_TO = 1 << 20  # watched model files up to this size (configs) are hashed; weights by size and mtime
MODEL_FILES = ("config.json", "*.safetensors", "*.bin")


def _sha256(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()


@dataclass(frozen=True)
class HeldFile:
    """One file as it was when held: its bytes and hash (None: it did not exist)."""

    role: str
    path: Path
    data: bytes | None
    sha256: str | None

    @classmethod
    def read(cls, role: str, path: Path) -> HeldFile:
        if not path.is_file():
            return cls(role, path, None, None)
        raw = path.read_bytes()
        return cls(role, path, raw, _sha256(raw))

    def change(self) -> str | None:
        """How the file on disk differs from the held copy, or None."""
        now = self.path.read_bytes() if self.path.is_file() else None
        if now is None and self.data is None:
            return None
        if now is None:
            return f"{self.role} {self.path} was deleted (held: sha256 {self.sha256[:12]})"
        if self.data is None:
            return f"{self.role} {self.path} appeared (absent when held)"
        digest = _sha256(now)
        if digest != self.sha256:
            return f"{self.role} {self.path} was rewritten (sha256 {self.sha256[:12]} when held, now {digest[:12]})"
        return None


@dataclass(frozen=True)
class WatchedFile:
    """A model file watched for changes: hash when small, else size and modification time."""

    path: Path
    fingerprint: tuple

    @classmethod
    def of(cls, path: Path) -> WatchedFile:
        return cls(path, cls._fingerprint(path))

    @staticmethod
    def _fingerprint(path: Path) -> tuple:
        try:
            stat = path.stat()
        except OSError:
            return ("absent",)
        if stat.st_size <= HASHED_UP_TO:
            return ("sha256", _sha256(path.read_bytes()))
        return ("stat", stat.st_size, stat.st_mtime_ns, stat.st_ino)

    def change(self) -> str | None:
        if self._fingerprint(self.path) != self.fingerprint:
            return f"model file {self.path} changed"
        return None


def _model_files(directory: str | None) -> list[Path]:
    if directory is None or not Path(directory).is_dir():
        return []
    return sorted({p for pattern in MODEL_FILES for p in Path(directory).glob(pattern) if p.is_file()})


class OracleCopy:
    """The oracle files of one session, held in memory (module doc)."""

    def __init__(self, settings) -> None:
        s = settings
        self.settings = settings
        self.manifest = HeldFile.read("pair manifest", manifest_path(s.model_dir))
        self._golden: dict[str, HeldFile] = {}
        for key in dict.fromkeys(("float32", s.dtype, f"{s.dtype}-{s.device.split(':', 1)[0]}")):
            try:
                path = golden_path(s.golden_dir, s.pair_name, s.prompt_set, key)
            except GoldenError:  # a name that cannot key a golden file: the golden check says so
                continue
            self._golden[key] = HeldFile.read(f"golden file ({key})", path)
        self._parsed: dict[str, GoldenFile | None] = {}
        self.watched = [WatchedFile.of(p) for p in _model_files(s.model_dir) + _model_files(s.drafter_dir)]
        self._calibration: NoiseModel | CalibrationError
        try:
            self._calibration = calibration_from_manifest(self.manifest.path, self.manifest.data, s.dtype)
        except CalibrationError as exc:
            self._calibration = exc
        hold_rules(str(s.model_dir), s.dtype, self._calibration)  # verdicts that see only settings (rules_for)

    @property
    def calibration(self) -> NoiseModel:
        if isinstance(self._calibration, CalibrationError):
            raise self._calibration
        return self._calibration

    def golden(self, key: str) -> GoldenFile | None:
        """The held golden file for ``key`` (``float32``, ``bfloat16``, ``bfloat16-cuda``): None when it
        was absent; a :class:`GoldenError` naming the file when it cannot be read."""
        held = self._golden.get(key)
        if held is None:
            s = self.settings
            golden_path(s.golden_dir, s.pair_name, s.prompt_set, key)  # raises the naming error
            return None
        if held.data is None:
            return None
        if key not in self._parsed:
            self._parsed[key] = parse_golden(held.data, held.path)
        return self._parsed[key]

    def float32_golden(self, max_new_tokens: int) -> GoldenFile | None:
        """The held float32 golden file when it holds outputs at least ``max_new_tokens`` long, else None
        (absent, unreadable or shorter): the reference's recorded rounds, acceptance evidence in place of a
        replay or a rerun of the reference."""
        try:
            golden = self.golden("float32")
        except GoldenError:
            return None
        return None if golden is None or golden.max_new_tokens < max_new_tokens else golden

    def golden_file(self, key: str) -> Path | None:
        held = self._golden.get(key)
        return None if held is None else held.path

    def files(self) -> list[HeldFile]:
        return [self.manifest, *self._golden.values()]

    def changes(self) -> list[str]:
        """Every held or watched file that changed on disk since it was held."""
        found = [f.change() for f in self.files()] + [w.change() for w in self.watched]
        return [c for c in found if c]

    def describe(self) -> dict:
        """What was held, for a report: role, path and hash of each file."""
        return {f.role: {"path": str(f.path), "sha256": f.sha256} for f in self.files()}


_COPIES: weakref.WeakKeyDictionary[object, OracleCopy] = weakref.WeakKeyDictionary()


def hold(session) -> OracleCopy:
    """Read and hold ``session``'s oracle files, once per session (call it before the engine starts)."""
    copy = _COPIES.get(session)
    if copy is None:
        copy = _COPIES[session] = OracleCopy(session.settings)
    return copy


def oracle_for(session) -> OracleCopy:
    """The held copy of ``session``'s oracle files (held now if nothing held it earlier)."""
    return hold(session)


def changed_on_disk(session) -> str | None:
    """One line naming every oracle file that changed on disk since it was held, or None."""
    copy = _COPIES.get(session)
    changes = copy.changes() if copy is not None else []
    if not changes:
        return None
    return (
        "oracle files changed on disk during the run (verdicts used the copy held before the engine started): "
        + "; ".join(changes)
    )
