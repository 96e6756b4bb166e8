"""``.ci/installer.sh``: the engine tiers' installs take uv with this machine's pip settings handed over, else pip.

A fake ``python`` (answering ``-m pip config list`` with the settings given and logging ``-m pip install``) and a fake
``uv`` in the venv stand in for the real ones, so that what each install would have run is read back exactly.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

FAKE_PYTHON = """#!/usr/bin/env bash
if [[ "$1 $2 $3 $4" == "-m pip config list" ]]; then printf '%s\\n' "$FAKE_PIP_CONFIG"; exit 0; fi
if [[ "$1 $2 $3" == "-m pip install" ]]; then shift 3; echo "pip install $*" >> "$CALLS"
  [[ "$*" == *" uv"* && -n "$FAKE_NO_UV" ]] && exit 1
  [[ "$*" == *" uv"* ]] && { printf '#!/usr/bin/env bash\\necho "uv $*" >> "$CALLS"; exit ${FAKE_UV_RC:-0}\\n' \
    > "$VIRTUAL_ENV/bin/uv"; chmod +x "$VIRTUAL_ENV/bin/uv"; }
  exit 0; fi
exit 3
"""

MACHINE = "\n".join(
    [
        ":env:.default-timeout='180'",
        ":env:.disable-pip-version-check='1'",
        ":env:.find-links='/opt/wheels'",
        "global.cert='/etc/ssl/certs/ca.crt'",
        "global.constraint='/etc/xdg/pip/constraints.txt'",
        "global.extra-index-url='file:///opt/pypi/simple file:///opt/pypi-more/simple'",
        "global.index-url='https://mirror.example/simple'",
    ]
)


def _install(tmp_path: Path, config: str, *, env: dict | None = None, args: str = "-q --no-compile pkg==1.0"):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True, exist_ok=True)
    fakes = tmp_path / "fakes"
    fakes.mkdir(exist_ok=True)
    (fakes / "python").write_text(FAKE_PYTHON)
    (fakes / "python").chmod(0o755)
    calls = tmp_path / "calls.txt"
    script = (
        f". {ROOT}/.ci/installer.sh; venv_install {tmp_path}/log {args}; rc=$?; "
        'echo "rc=$rc ssl=${SSL_CERT_FILE:-} timeout=${UV_HTTP_TIMEOUT:-}"'
    )
    run_env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("DDTREE_INSTALLER", "SSL_CERT", "UV_"))},
        "PATH": f"{fakes}:{os.environ['PATH']}",
        "VIRTUAL_ENV": str(venv),
        "FAKE_PIP_CONFIG": config,
        "CALLS": str(calls),
        **(env or {}),
    }
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=run_env, cwd=ROOT, timeout=60)
    lines = calls.read_text().splitlines() if calls.exists() else []
    return out, lines


def test_uv_gets_every_pip_setting_of_the_machine(tmp_path):
    out, calls = _install(tmp_path, MACHINE)
    assert out.returncode == 0, out.stderr
    assert calls[0] == "pip install -q --no-compile uv"  # uv itself, by pip, into the venv
    venv_python = tmp_path / "venv" / "bin" / "python"
    assert calls[1:] == [
        f"uv pip install --python {venv_python} --index-strategy unsafe-best-match --find-links /opt/wheels "
        "--constraint /etc/xdg/pip/constraints.txt --extra-index-url file:///opt/pypi/simple "
        "--extra-index-url file:///opt/pypi-more/simple --index-url https://mirror.example/simple -q pkg==1.0"
    ]
    assert "rc=0 ssl=/etc/ssl/certs/ca.crt timeout=180" in out.stdout


@pytest.mark.parametrize(
    "config, env, why",
    [
        (MACHINE + "\nglobal.proxy='http://proxy:3128'", {}, "pip setting 'proxy' has no uv counterpart"),
        (MACHINE, {"DDTREE_INSTALLER": "pip"}, None),
        (MACHINE, {"FAKE_NO_UV": "1"}, "uv could not be installed"),
    ],
    ids=["a setting uv lacks", "DDTREE_INSTALLER=pip", "no uv to be had"],
)
def test_pip_installs_when_uv_cannot_stand_in(tmp_path, config, env, why):
    out, calls = _install(tmp_path, config, env=env)
    assert out.returncode == 0, out.stderr
    assert calls[-1] == "pip install -q --no-compile pkg==1.0"
    assert not any(c.startswith("uv ") for c in calls)
    if why:
        assert why in out.stderr


def test_a_failed_uv_install_is_tried_again_with_pip_and_says_so(tmp_path):
    out, calls = _install(tmp_path, MACHINE, env={"FAKE_UV_RC": "1"})
    assert out.returncode == 0, out.stderr
    assert calls[-2].startswith("uv pip install") and calls[-1] == "pip install -q --no-compile pkg==1.0"
    assert "uv pip install -q --no-compile pkg==1.0 failed" in out.stderr


def test_installer_uv_refuses_the_fallback(tmp_path):
    out, calls = _install(tmp_path, MACHINE, env={"FAKE_UV_RC": "1", "DDTREE_INSTALLER": "uv"})
    assert "rc=1" in out.stdout and calls[-1].startswith("uv pip install")
    out, _ = _install(tmp_path, MACHINE + "\nglobal.proxy='http://p'", env={"DDTREE_INSTALLER": "uv"})
    assert out.returncode == 2 and "do not translate" in out.stderr


def test_an_unknown_installer_is_one_clear_error(tmp_path):
    out, calls = _install(tmp_path, MACHINE, env={"DDTREE_INSTALLER": "conda"})
    assert out.returncode == 2 and "DDTREE_INSTALLER must be auto, uv or pip, not 'conda'" in out.stderr
    assert calls == []


def test_pip_precedence_is_kept_one_value_a_setting(tmp_path):
    """pip takes a setting from its environment variable over its files, and an ``install`` section over ``global``;
    a setting of another command's section (``download``) is not an install's. uv must get the one value pip would
    use, not every value listed: an extra index pip ignores could serve uv another build of a package."""
    config = "\n".join(
        [
            ":env:.extra-index-url='file:///env/simple'",
            "download.extra-index-url='file:///download/simple'",
            "download.find-links='/download/wheels'",
            "global.extra-index-url='file:///file/simple'",
            "global.index-url='https://global.example/simple'",
            "install.index-url='https://install.example/simple'",
        ]
    )
    out, calls = _install(tmp_path, config)
    assert out.returncode == 0, out.stderr
    uv = calls[-1]
    assert uv.startswith("uv pip install")
    assert "--extra-index-url file:///env/simple" in uv and "/file/simple" not in uv and "/download/" not in uv
    assert "--index-url https://install.example/simple" in uv and "global.example" not in uv
    assert "--find-links" not in uv  # listed for `pip download` only


def test_a_setting_written_over_several_lines_gives_each_value(tmp_path):
    """A pip.conf value on several lines is listed as one line with ``\\n`` between its values (pip prints the
    value's repr): each is an index of its own. A pip config file named by PIP_CONFIG_FILE is listed as
    ``config-file``, which is no install setting."""
    config = "\n".join(
        [
            ":env:.config-file='/etc/pip-ci.conf'",
            "global.extra-index-url='\\nhttps://a.example/simple\\nhttps://b.example/simple'",
        ]
    )
    out, calls = _install(tmp_path, config)
    assert out.returncode == 0, out.stderr
    assert calls[-1].startswith("uv pip install"), out.stderr
    assert "--extra-index-url https://a.example/simple --extra-index-url https://b.example/simple" in calls[-1]
    assert "\\n" not in calls[-1]
