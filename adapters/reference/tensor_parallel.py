"""Tensor parallelism for the reference engine: N ranks running the same spec loop in lockstep.

transformers shards the target with its own plan (``DistributedConfig(tp_plan="auto")``): attention
heads and MLP columns are split over the ranks, row-parallel outputs are all-reduced and the logits
gathered. So every rank holds the same logits and the same hidden-state features, makes the same
tree, walk and sampling decisions, and differs from the others only in its KV cache, which holds
its own heads. The drafter is replicated on every rank.

The engine's own process is rank 0. :class:`RankGroup` spawns ranks 1..N-1, each building the same
engine class. Every ``generate`` call goes to all ranks over a gloo control group. Each rank sends
back a digest of its results. Rank 0 refuses a result that another rank disagrees with: diverging
ranks would mean a rank-local decision, which is a bug.

Collectives use NCCL on CUDA, where rank r takes ``cuda:r`` of the visible devices, and gloo on CPU.
CPU TP exists so that the sharded path is tested on machines without GPUs. A follower exits when
rank 0's process dies, so a killed engine leaves no ranks behind.
"""

from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import threading
import time

import torch
import torch.distributed as dist

from ..interface import EngineError, Request, RequestResult, RunConfig
from ..process import allow_children

__all__ = ["RankGroup", "rank", "local_device", "shardable_sizes"]

COLLECTIVE_TIMEOUT = datetime.timedelta(minutes=10)
JOIN_TIMEOUT_S = 30.0
START_TIMEOUT_S = 300.0


def rank() -> int:
    """This process's rank in the active group (0 when there is none)."""
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def local_device(device: str, tensor_parallel_size: int) -> str:
    """The device this rank computes on: ``cuda:<rank>`` under CUDA TP, else ``device`` unchanged."""
    if tensor_parallel_size > 1 and device.split(":", 1)[0] == "cuda":
        return f"cuda:{rank()}"
    return device


def shardable_sizes(
    num_heads: int, num_kv_heads: int, intermediate_size: int, vocab_size: int, limit: int
) -> list[int]:
    """TP sizes up to ``limit`` that split heads, KV heads, MLP columns and vocabulary evenly."""
    return [
        n
        for n in range(1, max(1, limit) + 1)
        if not (num_heads % n or num_kv_heads % n or intermediate_size % n or vocab_size % n)
    ]


_RANK_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")


def _join(rank_: int, size: int, store, device_type: str):
    """Join the group as ``rank_`` through ``store``; returns the gloo control group.

    transformers' TP loader reads the rank variables (``LOCAL_RANK`` picks the device).
    """
    os.environ.update(dict(zip(_RANK_ENV, map(str, (rank_, size, rank_, size)))))
    if device_type == "cuda":
        torch.cuda.set_device(rank_)
    dist.init_process_group(
        "nccl" if device_type == "cuda" else "gloo",
        store=store,
        rank=rank_,
        world_size=size,
        timeout=COLLECTIVE_TIMEOUT,
    )
    return dist.new_group(backend="gloo", timeout=COLLECTIVE_TIMEOUT)


def _wait_for(followers: list, store) -> None:
    """Block until every follower has reached the store; a follower that dies first is an error."""
    deadline = time.monotonic() + START_TIMEOUT_S
    for rank_, process in enumerate(followers, start=1):
        while not store.check([f"arrived/{rank_}"]):
            if not process.is_alive():
                raise EngineError(
                    f"reference engine: tensor-parallel rank {rank_} exited with code "
                    f"{process.exitcode} before joining (see the engine log)"
                )
            if time.monotonic() > deadline:
                raise EngineError(
                    f"reference engine: tensor-parallel rank {rank_} did not join within {START_TIMEOUT_S:.0f} s"
                )
            time.sleep(0.2)


def _digest(results: list[RequestResult]) -> list[tuple]:
    """What every rank must agree on."""
    return [(r.output_ids, r.finish_reason, r.acceptance_lengths, r.error) for r in results]


def _difference(mine: list[tuple], theirs: list[tuple]) -> str:
    """Where two digests first differ, in words."""
    index = next(i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b)
    for field, a, b in zip(("output", "finish reason", "acceptance lengths", "error"), theirs[index], mine[index]):
        if a != b:
            if field == "output" and a and b:
                at = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
                return (
                    f"request {index}: output token {at} is {a[at] if at < len(a) else 'missing'} there, "
                    f"{b[at] if at < len(b) else 'missing'} on rank 0"
                )
            return f"request {index}: {field} {a!r} there, {b!r} on rank 0"
    return f"request {index}"


def _run(engine, requests: list[Request], config: RunConfig):
    """This rank's results and digest, or (None, the error as one line)."""
    try:
        results = engine.generate_local(requests, config)
    except Exception as exc:  # sent to rank 0, which raises it with the rank named
        return None, f"{type(exc).__name__}: {exc}"
    return results, _digest(results)


def _exit_with(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(1.0)
    os._exit(1)


def _follower(
    rank_: int,
    size: int,
    port: int,
    device_type: str,
    engine_class,
    model_dir: str,
    drafter_dir: str | None,
    options: dict,
    parent_pid: int,
    threads: int,
) -> None:
    """Main of ranks 1..N-1: build the engine, join, then run each call rank 0 broadcasts until 'close'."""
    threading.Thread(target=_exit_with, args=(parent_pid,), daemon=True).start()
    torch.set_num_threads(threads)
    engine = engine_class(model_dir, drafter_dir, **options)
    store = dist.TCPStore("127.0.0.1", port, size, is_master=False, timeout=COLLECTIVE_TIMEOUT)
    store.set(f"arrived/{rank_}", "1")
    control = _join(rank_, size, store, device_type)
    while True:
        message = [None]
        dist.broadcast_object_list(message, src=0, group=control)
        if message[0][0] == "close":
            break
        _, requests, config = message[0]
        _, digest = _run(engine, requests, config)
        dist.gather_object(digest, None, dst=0, group=control)
    engine.close()
    dist.destroy_process_group()


class RankGroup:
    """Ranks 1..N-1 of the reference engine, with this process as rank 0 (see module doc)."""

    def __init__(self, engine, size: int, device_type: str) -> None:
        if dist.is_initialized():
            raise EngineError(
                "reference engine: a torch.distributed process group is already active in this "
                "process; tensor parallelism needs its own"
            )
        allow_children()
        self.size, self.device_type = size, device_type
        self._environ = {k: os.environ.get(k) for k in _RANK_ENV}
        store = dist.TCPStore("127.0.0.1", 0, size, is_master=True, timeout=COLLECTIVE_TIMEOUT, wait_for_workers=False)
        context = mp.get_context("spawn")
        self._followers = [
            context.Process(
                target=_follower,
                name=f"reference-tp-rank{r}",
                daemon=True,
                args=(
                    r,
                    size,
                    store.port,
                    device_type,
                    type(engine),
                    engine.model_dir,
                    engine.drafter_dir,
                    engine.options,
                    os.getpid(),
                    torch.get_num_threads(),
                ),
            )
            for r in range(1, size)
        ]
        for process in self._followers:
            process.start()
        try:
            _wait_for(self._followers, store)
        except EngineError:
            self._stop_followers()
            raise
        self._control = _join(0, size, store, device_type)

    def generate(self, engine, requests: list[Request], config: RunConfig) -> list[RequestResult]:
        dist.broadcast_object_list([("generate", requests, config)], src=0, group=self._control)
        results, mine = _run(engine, requests, config)
        digests = [None] * self.size
        dist.gather_object(mine, digests, dst=0, group=self._control)
        where = f"reference engine, tensor_parallel_size={self.size}"
        if results is None:
            raise EngineError(f"{where}: rank 0 failed: {mine}")
        for r, theirs in enumerate(digests[1:], start=1):
            if isinstance(theirs, str):
                raise EngineError(f"{where}: rank {r} failed: {theirs}")
            if theirs != mine:
                raise EngineError(
                    f"{where}: rank {r} disagrees with rank 0 on {_difference(mine, theirs)}; every "
                    "rank must make the same decisions from the same gathered logits"
                )
        return results

    def close(self) -> None:
        """Stop the ranks and leave the process group; quiet if a rank is already gone."""
        try:
            dist.broadcast_object_list([("close",)], src=0, group=self._control)
        except RuntimeError:  # a rank died: the kill below covers it
            pass
        finally:
            self._stop_followers(JOIN_TIMEOUT_S)
            dist.destroy_process_group()
            for key, value in self._environ.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value

    def _stop_followers(self, grace_s: float = 0.0) -> None:
        for process in self._followers:
            process.join(grace_s)
            if process.is_alive():
                process.kill()
                process.join(5)
