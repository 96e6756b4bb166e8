"""Issue 13 on one GPU, in one command: calibrate, record low-precision goldens, run the default
plan in bfloat16 and float16 on every fixture prompt, and run every mutant in bfloat16.

    python scripts/gpu_bf16_run.py --out "$OUT"              # on the GPU machine (device cuda)
    python scripts/gpu_bf16_run.py --out /tmp/x --device cpu --limit 2 --mutant-limit 2 --budgets 16 \\
        --max-new-tokens 16 --flip-limit 2                    # a quick CPU rehearsal

Stages (each in its own processes, logs under OUT/logs):
1. calibration: ``scripts/calibrate_near_tie.py`` on the device, merged into
   ``golden/fixture/MANIFEST.json`` (copied to OUT/MANIFEST.json); beside it,
2. golden files ``golden/records/fixture/fixture-<dtype>-<device kind>.json`` for bfloat16 and float16
   (copied to OUT/golden/), recorded by the reference engine, in parallel;
3. in parallel: the default plan on the reference engine in bfloat16 and in float16 on all prompts
   with budgets up to 1024 (reports OUT/check-reference-<dtype>.{json,md,html});

From the start, beside stages 1-3: the mutation table in bfloat16 on ``--mutant-limit`` prompts,
sharded over ``--jobs`` processes (OUT/mutants-bfloat16-<i>.json, rewritten after every mutant);
mutants that start before the calibration ends use the manifest's calibration as it was.
4. OUT/summary.md: check counts, excused positions and rounds per check, and the mutation table.

Every stage has a deadline (``--deadline`` seconds in all); what finished is summarised either way.
The package is imported from this checkout when it is not installed (a shim on PYTHONPATH).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _python_env(threads: int) -> dict:
    """Environment whose python imports ddtree_conformance from this checkout (shim if not installed)."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1")
    probe = subprocess.run(
        [sys.executable, "-c", "import ddtree_conformance, sys; print(ddtree_conformance.__file__)"],
        capture_output=True,
        text=True,
        env=env,
    )
    if probe.returncode == 0 and Path(probe.stdout.strip()).resolve().is_relative_to(ROOT):
        return env
    shim = Path(tempfile.mkdtemp(prefix="ddtree-shim-")) / "ddtree_conformance"
    shim.mkdir()
    for item in (ROOT / "conformance").iterdir():
        (shim / item.name).symlink_to(item)
    (shim / "adapters").symlink_to(ROOT / "adapters")
    (shim / "golden").symlink_to(ROOT / "golden")
    env["PYTHONPATH"] = os.pathsep.join([str(shim.parent), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def _start(cmd: list[str], log: Path, env: dict) -> subprocess.Popen:
    log.parent.mkdir(parents=True, exist_ok=True)
    handle = log.open("w")
    handle.write("$ " + " ".join(cmd) + "\n")
    handle.flush()
    return subprocess.Popen(cmd, stdout=handle, stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True)


def _wait(procs: list[tuple[str, subprocess.Popen]], deadline: float) -> dict[str, int | str]:
    status: dict[str, int | str] = {}
    for name, proc in procs:
        try:
            status[name] = proc.wait(timeout=max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
            status[name] = "killed at the deadline"
        print(f"[{time.strftime('%H:%M:%S')}] {name}: {status[name]}", flush=True)
    return status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--limit", type=int, default=None, help="prompts of the check runs (default: all 80)")
    parser.add_argument("--budgets", default="16,64,256,1024")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--mutant-limit", type=int, default=8)
    parser.add_argument("--mutant-budgets", default="16,256")
    parser.add_argument("--flip-limit", type=int, default=40, help="prompts of the drafter flip calibration")
    parser.add_argument("--jobs", type=int, default=4, help="parallel mutant processes")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads per process")
    parser.add_argument("--deadline", type=float, default=460.0, help="seconds for the whole run")
    parser.add_argument("--skip-calibration", action="store_true")
    parser.add_argument(
        "--skip-golden",
        action="store_true",
        help="record no golden files (the golden check then uses those already there, or skips)",
    )
    parser.add_argument(
        "--mutant-device",
        default=None,
        help="device of the mutant runs (default: --device); the "
        "GPU time-slices between processes, so mutants on the host's cores leave it to the checks",
    )
    parser.add_argument(
        "--float16-limit", type=int, default=None, help="prompts of the float16 check (default: --limit)"
    )
    parser.add_argument(
        "--stage12-share",
        type=float,
        default=0.45,
        help="share of the deadline for calibration and golden recording (they run side by side)",
    )
    parser.add_argument(
        "--check-dtypes", default="bfloat16,float16", help="dtypes of the stage-3 default-plan runs (empty: none)"
    )
    parser.add_argument(
        "--pack-logs",
        action="store_true",
        help="end with OUT/logs packed into OUT/logs.tar.gz and "
        "no HTML reports (the device tool brings back at most 8 files)",
    )
    parser.add_argument(
        "--golden-dir",
        default=str(ROOT / "golden/records"),
        help="where the golden files are read and the new ones written",
    )
    args = parser.parse_args(argv)
    started = time.time()
    deadline = started + args.deadline
    out = Path(args.out).resolve()
    (out / "logs").mkdir(parents=True, exist_ok=True)
    env = _python_env(args.threads)
    py = sys.executable
    kind = args.device.split(":", 1)[0]
    limit = [] if args.limit is None else ["--limit", str(args.limit)]
    status: dict = {}

    mutants = []  # the mutants run from the start, beside everything else, until the deadline
    for i in range(args.jobs):
        cmd = [
            py,
            "scripts/mutation_table.py",
            "--dtype",
            "bfloat16",
            "--device",
            args.mutant_device or args.device,
            "--budgets",
            args.mutant_budgets,
            "--limit",
            str(args.mutant_limit),
            "--threads",
            str(args.threads),
            "--shard",
            f"{i}/{args.jobs}",
            "--json",
            str(out / f"mutants-bfloat16-{i}.json"),
        ]
        mutants.append((f"mutants {i}/{args.jobs}", _start(cmd, out / f"logs/mutants-{i}.log", env)))

    record = (
        "from ddtree_conformance.checks.golden_outputs import device_golden_path\n"
        "from ddtree_conformance.files import atomic_write\n"
        "from ddtree_conformance.golden_files import record_golden\n"
        "from ddtree_conformance.session import SuiteSession, SuiteSettings\n"
        "import sys, torch\n"
        f"torch.set_num_threads({args.threads})\n"
        f"s = SuiteSettings(dtype=sys.argv[1], device=sys.argv[2], isolate=False, "
        f"max_new_tokens={args.max_new_tokens}, limit={args.limit},"
        " golden_dir=sys.argv[4])\n"
        "session = SuiteSession(s)\n"
        "golden = record_golden(session, [int(b) for b in sys.argv[3].split(',')])\n"
        "session.close()\n"
        "path = device_golden_path(s.golden_dir, s.pair_name, s.prompt_set, s.dtype, s.device)\n"
        "atomic_write(path, golden.model_dump_json(indent=1) + '\\n')\n"
        "print('wrote', path)\n"
    )
    stage12 = []
    if not args.skip_calibration:  # 1. calibration (the checks after it read it), beside 2.
        cmd = [
            py,
            "scripts/calibrate_near_tie.py",
            "--model",
            "golden/fixture/target",
            "--drafter",
            "golden/fixture/drafter",
            "--device",
            args.device,
            "--max-new-tokens",
            str(args.max_new_tokens),
            "--flip-limit",
            str(args.flip_limit),
            "--budgets",
            "16,64,256",
        ]
        stage12.append(("calibration", _start(cmd, out / "logs/calibration.log", env)))
    if not args.skip_golden:
        stage12 += [
            (
                f"golden {d}",
                _start(
                    [py, "-c", record, d, args.device, args.budgets, args.golden_dir], out / f"logs/golden-{d}.log", env
                ),
            )
            for d in ("bfloat16", "float16")
        ]
    status |= _wait(stage12, started + args.stage12_share * args.deadline)
    if not args.skip_calibration:
        shutil.copy(ROOT / "golden/fixture/MANIFEST.json", out / "MANIFEST.json")
    (out / "golden").mkdir(exist_ok=True)
    for d in ("bfloat16", "float16"):
        path = Path(args.golden_dir) / f"fixture/fixture-{d}-{kind}.json"
        if path.is_file():
            shutil.copy(path, out / "golden" / path.name)

    procs = []
    for d in [d for d in args.check_dtypes.split(",") if d]:  # 3. the default plan, and the mutants, all at once
        cmd = [
            py,
            "-c",
            "from ddtree_conformance.cli import app; app()",
            "check",
            "--dtype",
            d,
            "--device",
            args.device,
            "--budgets",
            args.budgets,
            "--max-new-tokens",
            str(args.max_new_tokens),
            "--threads",
            str(args.threads),
            "--golden-dir",
            args.golden_dir,
            "--out",
            str(out / f"check-reference-{d}.json"),
            *(["--limit", str(args.float16_limit)] if d == "float16" and args.float16_limit else limit),
        ]
        procs.append((f"check {d}", _start(cmd, out / f"logs/check-{d}.log", env)))
    status |= _wait(procs + mutants, deadline)
    summary = summarise(out, status, time.time() - started, [d for d in args.check_dtypes.split(",") if d])
    (out / "summary.md").write_text(summary)
    print(summary)
    if args.pack_logs:
        with tarfile.open(out / "logs.tar.gz", "w:gz") as tar:
            tar.add(out / "logs", arcname="logs")
        shutil.rmtree(out / "logs")
        for html in out.glob("*.html"):
            html.unlink()
    return 0


def summarise(out: Path, status: dict, seconds: float, dtypes: list[str]) -> str:
    lines = [f"# Issue 13 GPU run ({seconds:.0f} s)", "", "| stage | exit |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in status.items()]
    for d in dtypes:
        path = out / f"check-reference-{d}.json"
        if not path.is_file():  # stopped at the deadline: the progress lines say what finished
            log = out / f"logs/check-{d}.log"
            done = (
                [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.startswith("[ddtree] check ")]
                if log.is_file()
                else []
            )
            lines += ["", f"## reference {d}: no report, {len(done)} checks finished (logs/check-{d}.log)", ""]
            lines += [f"- {ln}" for ln in done]
            continue
        report = json.loads(path.read_text())
        lines += [
            "",
            f"## reference {d}: {report.get('counts')} in {report.get('elapsed_s')} s",
            "",
            "| check | status | excused positions (largest gap / ceiling) | excused rounds (target / drafter) |",
            "|---|---|---|---|",
        ]
        for r in report.get("results", []):
            det = r.get("details") or {}
            sc = det.get("scoring") or {}
            pos = (
                f"{sc.get('excused')}/{sc.get('positions')} ({sc.get('largest_excused_gap', 0):.3g} / "
                f"{sc.get('ceiling')})"
                if sc
                else "-"
            )
            rounds = (
                f"{len(det['target_near_tie_rounds'])} / {len(det['drafter_near_tie_rounds'])} of {det.get('rounds')}"
                if "target_near_tie_rounds" in det
                else "-"
            )
            lines.append(f"| {r['check']} | {r['status']} | {pos} | {rounds} |")
        failed = [r for r in report.get("results", []) if r["status"] == "fail"]
        lines += [f"- FAIL {r['check']}: {r['message']}" for r in failed]
    rows = []
    for path in sorted(out.glob("mutants-bfloat16-*.json")):
        rows += json.loads(path.read_text())
    lines += ["", "## mutants in bfloat16", "", "| mutant | failed checks | first message |", "|---|---|---|"]
    lines += [f"| {r['engine']} | {', '.join(r['failed']) or 'NONE (hole)'} | {r['message'][:240]} |" for r in rows]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
