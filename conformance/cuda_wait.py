"""How the timing process waits for its GPU: spinning on a core, or asleep until the GPU wakes it.

By default a CUDA process with fewer contexts than cores *spins* while it waits for the device (every
read back of a round's result). Spinning is fast on a quiet machine; on a busy one (a CI runner with a
build beside the benchmark) the spinning thread is one more CPU hog: the scheduler preempts it for a
whole time slice, often just as the GPU finishes, and the GPU idles until the thread runs again. A
thread that *sleeps* in the wait instead (CUDA's blocking sync) is woken when the device is done, and a
woken sleeper is scheduled ahead of the busy processes: the hope was that the delays a load adds stay
short. Measured on an H200 beside 16 busy processes (``scripts/measurements/2026-12-05-issue29-wait/``)
it did not narrow the spread of stressed A/B repeats, and it slowed a quiet round by 5-6 % (every read
back pays a wake-up), so the bench keeps CUDA's default; the trial and round scripts take
``--cuda-wait`` to measure it again.

:func:`wait_for_gpu` sets the wait mode of the process's primary context on CUDA's driver API, before or
after the context exists (CUDA 12 applies it either way), and :func:`current_wait` reads it back, so a
report can say which mode its timings ran under. Both speak for the whole process: every engine measured
in it waits the same way, so an A/B comparison stays fair.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from functools import cache

__all__ = ["WAIT_MODES", "current_wait", "wait_for_gpu"]

# CUdevice primary-context scheduling flags (cuda.h: CU_CTX_SCHED_*)
_FLAGS = {"auto": 0x00, "spin": 0x01, "yield": 0x02, "blocking": 0x04}
_MASK = 0x07
WAIT_MODES = tuple(_FLAGS)


class CudaWaitError(RuntimeError):
    """The driver refused to set or read the wait mode."""


@cache
def _driver():
    name = ctypes.util.find_library("cuda") or "libcuda.so.1"
    try:
        lib = ctypes.CDLL(name)
    except OSError as exc:
        raise CudaWaitError(f"no CUDA driver library ({name}): {exc}") from exc
    _check(lib.cuInit(0), "cuInit")
    return lib


def _check(status: int, what: str) -> None:
    if status != 0:
        raise CudaWaitError(f"{what} returned CUDA error {status}")


def _device(index: int) -> ctypes.c_int:
    device = ctypes.c_int()
    _check(_driver().cuDeviceGet(ctypes.byref(device), index), "cuDeviceGet")
    return device


def _index(device: str) -> int:
    _, _, index = device.partition(":")
    return int(index) if index else 0


def current_wait(device: str = "cuda") -> str:
    """The wait mode of ``device``'s primary context (``auto`` until a mode is set)."""
    flags, active = ctypes.c_uint(), ctypes.c_int()
    _check(
        _driver().cuDevicePrimaryCtxGetState(_device(_index(device)), ctypes.byref(flags), ctypes.byref(active)),
        "cuDevicePrimaryCtxGetState",
    )
    value = flags.value & _MASK
    return next((mode for mode, bits in _FLAGS.items() if bits == value), f"flags {value:#x}")


def wait_for_gpu(mode: str, device: str = "cuda") -> str:
    """Set how this process waits for ``device`` (``blocking``: asleep; ``spin``; ``yield``; ``auto``: CUDA's
    choice) and return the mode the context reports afterwards. A CPU device is left alone (``"-"``)."""
    if not device.startswith("cuda"):
        return "-"
    if mode not in _FLAGS:
        raise ValueError(f"wait mode {mode!r}: expected one of {', '.join(WAIT_MODES)}")
    dev = _device(_index(device))
    flags, active = ctypes.c_uint(), ctypes.c_int()
    _check(
        _driver().cuDevicePrimaryCtxGetState(dev, ctypes.byref(flags), ctypes.byref(active)),
        "cuDevicePrimaryCtxGetState",
    )
    driver = _driver()
    set_flags = getattr(driver, "cuDevicePrimaryCtxSetFlags_v2", None) or driver.cuDevicePrimaryCtxSetFlags
    _check(set_flags(dev, (flags.value & ~_MASK) | _FLAGS[mode]), "cuDevicePrimaryCtxSetFlags")
    return current_wait(device)
