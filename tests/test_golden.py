"""Golden files: atomic writes, refusal to overwrite, readable diffs, clear errors; the golden check."""

from __future__ import annotations

import json

import pytest

from ddtree_conformance.golden_files import (
    GoldenError,
    GoldenExists,
    GoldenFile,
    GoldenRecord,
    diff_golden,
    golden_path,
    load_golden,
    write_golden,
)


def _golden(output=(1, 2, 3), acceptance=(2, 1)) -> GoldenFile:
    record = GoldenRecord(
        prompt_ids=[5, 6],
        output_ids=list(output),
        top2_gaps=[1.0] * len(output),
        acceptance={"ddtree-16": list(acceptance)},
    )
    return GoldenFile(
        pair="p", prompt_set="s", dtype="float32", max_new_tokens=3, versions={"torch": "x"}, records={"a": record}
    )


def test_write_then_refuse_then_update_with_diff(tmp_path):
    path, diff = write_golden(tmp_path, _golden())
    assert path == golden_path(tmp_path, "p", "s", "float32") and path.is_file()
    assert diff == ["new golden file: 1 prompts"]
    with pytest.raises(GoldenExists, match="--update"):
        write_golden(tmp_path, _golden(output=(1, 9, 3)))
    assert load_golden(tmp_path, "p", "s", "float32").records["a"].output_ids == [1, 2, 3]  # untouched
    _, diff = write_golden(tmp_path, _golden(output=(1, 9, 3), acceptance=(3,)), update=True)
    assert any("output changes at token 1" in line for line in diff), diff
    assert any("ddtree-16 acceptance changes, tau 1.500 -> 3.000" in line for line in diff), diff
    assert load_golden(tmp_path, "p", "s", "float32").records["a"].output_ids == [1, 9, 3]
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".")]  # no temp files left


def test_diff_reports_added_and_removed_prompts():
    old, new = _golden(), _golden()
    new.records["b"] = new.records.pop("a")
    lines = diff_golden(old, new)
    assert "- prompt a removed" in lines and "+ prompt b added" in lines
    assert diff_golden(old, _golden()) == ["no changes"]


@pytest.mark.parametrize(
    "content, message",
    [
        ("{not json", "not valid JSON"),
        (json.dumps({"schema_version": 99}), "schema_version 99"),
        (
            json.dumps(
                {
                    "schema_version": 1,
                    "pair": "p",
                    "prompt_set": "s",
                    "dtype": "float32",
                    "max_new_tokens": 3,
                    "records": {"a": {"prompt_ids": [1]}},
                }
            ),
            "field records.a.output_ids",
        ),
    ],
)
def test_bad_golden_file_is_one_clear_error(tmp_path, content, message):
    path = golden_path(tmp_path, "p", "s", "float32")
    path.parent.mkdir(parents=True)
    path.write_text(content)
    with pytest.raises(GoldenError, match=message) as info:
        load_golden(tmp_path, "p", "s", "float32")
    assert str(path) in str(info.value)


def test_golden_check_catches_changed_output(random_pair, tmp_path):
    """Record with the reference, then a mutant whose output differs fails the golden check."""
    from ddtree_conformance.golden_files import record_golden
    from ddtree_conformance.session import SuiteSession, SuiteSettings
    from ddtree_conformance.testing.mutants import FirstRowsCompaction
    from ddtree_conformance.testing.runs import plan_and_run

    target, drafter = random_pair
    prompts = tmp_path / "set.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"q{i}", "prompt_ids": [i + 3, 7, i]}) + "\n" for i in range(3)))
    settings = SuiteSettings(
        model_dir=str(target),
        drafter_dir=str(drafter),
        pair_name="random",
        prompt_set=str(prompts),
        budgets=[16],
        max_new_tokens=20,
        isolate=False,
        golden_dir=str(tmp_path / "golden"),
    )
    session = SuiteSession(settings)
    try:
        write_golden(settings.golden_dir, record_golden(session, [16]))
    finally:
        session.close()
    good = plan_and_run(settings, None, ["golden/", "acceptance/"])
    assert [r.status for r in good] == ["pass"] * 4, [(r.check, r.message) for r in good]

    results = plan_and_run(settings, FirstRowsCompaction, ["golden/ddtree"])
    assert results[0].status == "fail" and "diverges at output token" in results[0].message


# -- safe writes and reads ---------------------------------------------------------------------
def test_atomic_write_fsyncs_file_and_folder_and_leaves_no_temp(tmp_path, monkeypatch):
    import os

    from ddtree_conformance import files

    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(files.os, "fsync", lambda fd: (synced.append(os.fstat(fd).st_mode), real_fsync(fd)))
    files.atomic_write(tmp_path / "a.json", "{}\n")
    import stat

    assert [stat.S_ISREG(m) for m in synced] == [True, False]  # the file before the rename, the folder after
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]


def test_atomic_write_removes_its_temp_file_on_any_exception(tmp_path, monkeypatch):
    from ddtree_conformance import files

    def broken_replace(src, dst):
        raise KeyboardInterrupt  # not even an Exception

    monkeypatch.setattr(files.os, "replace", broken_replace)
    with pytest.raises(KeyboardInterrupt):
        files.atomic_write(tmp_path / "a.json", "{}\n")
    assert list(tmp_path.iterdir()) == []


def test_next_write_removes_temp_files_a_killed_writer_left_and_names_them(tmp_path):
    from ddtree_conformance.files import atomic_write

    path = golden_path(tmp_path, "p", "s", "float32")
    path.parent.mkdir(parents=True)
    stale = [path.parent / f".{path.name}.ab12cd_9.tmp", path.parent / f".{path.name}.zz99aa00"]  # new and old style
    other = path.parent / ".other.json.ab12cd_9.tmp"  # another file's: not ours to remove
    for p in (*stale, other):
        p.write_text("half")
    warned: list[str] = []
    atomic_write(path, "{}\n", warn=warned.append)
    assert sorted(p.name for p in path.parent.iterdir()) == sorted([path.name, other.name])
    assert [w.split(":")[0] for w in warned] == [f"removed {p}" for p in sorted(stale)]


def test_update_replaces_a_corrupt_golden_file_with_a_warning_naming_it(tmp_path):
    path = golden_path(tmp_path, "p", "s", "float32")
    path.parent.mkdir(parents=True)
    path.write_bytes(b"\xff\xfe not json")
    with pytest.raises(GoldenExists):
        write_golden(tmp_path, _golden())
    warned: list[str] = []
    _, diff = write_golden(tmp_path, _golden(), update=True, warn=warned.append)
    (warning,) = warned  # it names the file and carries the load error (its wording: the test below)
    assert warning.startswith(f"replacing an unreadable golden file: {path}: not UTF-8 text"), warning
    assert "(byte 0xff at offset 0)" in warning, warning
    assert diff == ["new golden file: 1 prompts"]
    assert load_golden(tmp_path, "p", "s", "float32").records["a"].output_ids == [1, 2, 3]


def test_non_utf8_golden_file_is_one_error_naming_it(tmp_path):
    path = golden_path(tmp_path, "p", "s", "float32")
    path.parent.mkdir(parents=True)
    path.write_bytes(b'{"pair": "\xe9"}')
    with pytest.raises(GoldenError, match=r"not UTF-8 text \(byte 0xe9 at offset 10\)") as info:
        load_golden(tmp_path, "p", "s", "float32")
    assert str(path) in str(info.value)


@pytest.mark.parametrize(
    "pair, dtype",
    [
        ("../x", "float32"),
        ("a/b", "float32"),
        ("/abs", "float32"),
        ("..", "float32"),
        ("p", "float32/../../x"),
        ("", "float32"),
    ],
)
def test_names_cannot_leave_the_golden_folder(tmp_path, pair, dtype):
    with pytest.raises(GoldenError, match="cannot name a golden file under"):
        golden_path(tmp_path, pair, "s", dtype)
    assert golden_path(tmp_path, "p", "../../elsewhere/s.jsonl", "float32") == tmp_path / "p" / "s-float32.json"


def test_golden_check_on_a_corrupt_file_fails_naming_it_not_as_a_crash(random_pair, tmp_path):
    from ddtree_conformance.session import SuiteSettings
    from ddtree_conformance.testing.runs import plan_and_run

    target, drafter = random_pair
    settings = SuiteSettings(
        model_dir=str(target),
        drafter_dir=str(drafter),
        pair_name="random",
        budgets=[4],
        modes=["ddtree"],
        max_new_tokens=4,
        limit=1,
        isolate=False,
        golden_dir=str(tmp_path),
    )
    path = golden_path(tmp_path, "random", "fixture", "float32")
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    [result] = plan_and_run(settings, None, ["golden/"])
    assert result.status == "fail", result.message  # the load error's wording: test_bad_golden_file_is_one_clear_error
    assert result.message.startswith(f"{path}: not valid JSON (line 1: "), result.message
