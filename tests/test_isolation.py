"""Engines in their own process: results cross the pipe; a crash, a hang or a failed start is an
EngineDied carrying the log tail, the engine stays dead, its process group is killed, and the child
dies with the suite whatever kills the suite."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from ddtree_conformance.adapters.interface import EngineDied, EngineUsageError, Request, RunConfig
from ddtree_conformance.adapters.process import IsolatedEngine
from ddtree_conformance.testing.processes import pid_alive

# Light engines (no torch): their processes start in about a second.
BAD_ENGINES = textwrap.dedent(
    """
    import os, time
    from ddtree_conformance.adapters.interface import Capabilities, Engine, EngineError, RequestResult

    class Light(Engine):
        name = "light"

        def capabilities(self):
            return Capabilities(name=self.name, modes=["plain"], dtypes=["float32"], devices=["cpu"], sampling=False,
                                traces=False, per_round_acceptance=False)

        def generate(self, requests, config):
            return [RequestResult(output_ids=[1], finish_reason="length") for r in requests]

    class CrashingEngine(Light):
        def generate(self, requests, config):
            print("about to crash: simulated segfault")
            os._exit(139)

    class HangingEngine(Light):
        def generate(self, requests, config):
            time.sleep(600)

    class FailingInit(Light):
        def __init__(self, *a, **k):
            raise RuntimeError("no accelerator for this engine")

    class RaisingEngine(Light):
        def generate(self, requests, config):
            raise EngineError("device lost")

    class CountingCapabilities(Light):
        OPTIONS = ("counter",)

        def __init__(self, model_dir, drafter_dir=None, counter=None):
            super().__init__(model_dir, drafter_dir)
            self.counter = counter

        def capabilities(self):
            with open(self.counter, "a") as handle:
                handle.write("x")
            return super().capabilities()
    """
)


@pytest.fixture(scope="module")
def bad_engines(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad_engines")
    (root / "bad_engines_mod.py").write_text(BAD_ENGINES)
    os.environ["PYTHONPATH"] = os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])
    sys.path.insert(0, str(root))
    yield "bad_engines_mod"
    sys.path.remove(str(root))


def test_isolated_reference_matches_in_process(random_pair, reference_engine):
    target, drafter = random_pair
    requests = [Request(prompt_ids=[1, 2, 3], max_new_tokens=12), Request(prompt_ids=[9], max_new_tokens=7)]
    config = RunConfig(mode="ddtree", budget=8, trace=True)
    # Same torch thread count on both sides: CPU matmul reductions, and so the traced top-2
    # margins' low bits, depend on it.
    with IsolatedEngine("reference", str(target), str(drafter), torch_threads=torch.get_num_threads()) as engine:
        assert engine.capabilities().traces
        remote = engine.generate(requests, config)
    local = reference_engine.generate(requests, config)
    assert [r.output_ids for r in remote] == [r.output_ids for r in local]
    assert remote[0].traces == local[0].traces


def test_crash_raises_engine_died_with_log_tail_and_stays_dead(random_pair, bad_engines):
    target, drafter = random_pair
    engine = IsolatedEngine(f"{bad_engines}:CrashingEngine", str(target), str(drafter))
    with pytest.raises(EngineDied, match="crashed during generate: exit code 139") as info:
        engine.generate([Request(prompt_ids=[1], max_new_tokens=4)] * 2, RunConfig(mode="plain"))
    assert "simulated segfault" in info.value.log_tail  # the log tail travels with the failure
    assert engine.dead is info.value and engine.pid is None
    with pytest.raises(EngineDied, match="failed earlier and is not restarted.*exit code 139"):
        engine.capabilities()  # no fresh child behind the caller's back
    log_dir = os.path.dirname(engine.log_path)
    engine.close()
    assert not os.path.exists(log_dir)  # the engine's log folder goes with it


def test_error_raised_by_generate_becomes_failed_results(random_pair, bad_engines):
    target, drafter = random_pair
    with IsolatedEngine(f"{bad_engines}:RaisingEngine", str(target), str(drafter)) as engine:
        results = engine.generate([Request(prompt_ids=[1], max_new_tokens=4)] * 2, RunConfig(mode="plain"))
        assert [r.finish_reason for r in results] == ["error", "error"]
        assert "EngineError: device lost" in results[0].error
        assert engine.dead is None and engine.capabilities().name == "light"  # still running


def test_hang_times_out_kills_the_group_and_is_not_restarted(random_pair, bad_engines):
    target, drafter = random_pair
    engine = IsolatedEngine(f"{bad_engines}:HangingEngine", str(target), str(drafter), timeout_s=3, start_timeout_s=60)
    engine.capabilities()
    child = engine.pid
    started = time.monotonic()
    with pytest.raises(EngineDied, match=r"hung: no answer to generate within 3 s \(timeout_s\)"):
        engine.generate([Request(prompt_ids=[1], max_new_tokens=4)], RunConfig(mode="plain"))
    assert time.monotonic() - started < 60
    assert not pid_alive(child)
    with pytest.raises(EngineDied, match="not restarted"):
        engine.generate([Request(prompt_ids=[1], max_new_tokens=4)], RunConfig(mode="plain"))
    engine.close()


def test_capabilities_are_asked_once(random_pair, bad_engines, tmp_path):
    target, drafter = random_pair
    counter = tmp_path / "calls"
    with IsolatedEngine(
        f"{bad_engines}:CountingCapabilities", str(target), str(drafter), counter=str(counter)
    ) as engine:
        assert engine.capabilities() == engine.capabilities()
    assert counter.read_text() == "x"


def test_failing_start_names_the_engine_and_cause(random_pair, bad_engines):
    target, drafter = random_pair
    engine = IsolatedEngine(f"{bad_engines}:FailingInit", str(target), str(drafter))
    with pytest.raises(EngineDied, match="FailingInit.*failed to start.*no accelerator") as info:
        engine.capabilities()
    assert "RuntimeError: no accelerator" in info.value.log_tail  # the child's traceback is in its log


def test_unknown_option_found_in_the_child_is_a_usage_error(random_pair, bad_engines):
    target, drafter = random_pair
    engine = IsolatedEngine(f"{bad_engines}:CountingCapabilities", str(target), str(drafter), countr="x")
    with pytest.raises(EngineUsageError, match=r"unknown option\(s\) countr; known: counter"):
        engine.capabilities()
    with pytest.raises(EngineUsageError, match="countr"):  # kept, not retried
        engine.capabilities()
    engine.close()


def _wait_dead(pid: int, seconds: float = 20.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return True
        time.sleep(0.1)
    return False


SUITE_THAT_GETS_KILLED = textwrap.dedent(
    """
    import sys
    from ddtree_conformance.adapters.interface import Request, RunConfig
    from ddtree_conformance.adapters.process import IsolatedEngine

    if __name__ == "__main__":
        engine = IsolatedEngine("ddtree_conformance.testing.misbehaving:HangInGenerate", sys.argv[1], sys.argv[2],
                                timeout_s=600, helper=False)
        engine.capabilities()
        print(engine.pid, flush=True)
        engine.generate([Request(prompt_ids=[1], max_new_tokens=4)], RunConfig(mode="plain"))
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG and /proc are Linux's")
def test_engine_dies_with_the_suite_even_on_kill_9(random_pair, tmp_path):
    """A suite killed with SIGKILL cannot clean up: its engine child must go by itself."""
    script = tmp_path / "suite.py"
    script.write_text(SUITE_THAT_GETS_KILLED)
    env = {**os.environ, "TMPDIR": str(tmp_path)}  # the killed suite cannot remove its engine's log folder
    suite = subprocess.Popen(
        [sys.executable, str(script), *map(str, random_pair)], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        child = int(suite.stdout.readline())
        time.sleep(0.5)  # into generate: the child hangs there
        assert pid_alive(child)
        suite.kill()
        suite.wait(10)
        assert _wait_dead(child), f"engine child {child} outlived the suite"
    finally:
        if suite.poll() is None:
            suite.kill()


SUITE_THAT_CLOSES_TWO_ENGINES = textwrap.dedent(
    """
    import sys
    from multiprocessing import resource_tracker
    from ddtree_conformance.adapters.process import IsolatedEngine
    from ddtree_conformance.testing.processes import pid_alive

    if __name__ == "__main__":
        for _ in range(2):
            with IsolatedEngine("bad_engines_mod:Light", sys.argv[1], sys.argv[2]) as engine:
                engine.capabilities()
            tracker = resource_tracker._resource_tracker._pid
            print("tracker", tracker, "alive" if pid_alive(tracker) else "dead", flush=True)
    """
)


@pytest.mark.skipif(os.name != "posix", reason="multiprocessing's resource tracker is POSIX's")
def test_ending_an_engines_tree_spares_the_suites_own_processes(random_pair, bad_engines, tmp_path):
    """The first spawn starts the suite's multiprocessing resource tracker; it must not carry the engine's
    mark, or closing the engine kills it and the next start warns that it died."""
    script = tmp_path / "suite.py"
    script.write_text(SUITE_THAT_CLOSES_TWO_ENGINES)
    done = subprocess.run(
        [sys.executable, "-W", "always", str(script), *map(str, random_pair)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 2 and lines[0] == lines[1] and lines[0].endswith(" alive"), done.stdout  # one tracker, alive
    assert "resource_tracker" not in done.stderr, done.stderr
