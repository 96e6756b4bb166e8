"""cuda_wait: the wait mode is set on the primary context's scheduling bits alone, read back by name, and
a CPU device or an unknown mode is refused or left alone (the driver is faked: CI has no GPU)."""

from __future__ import annotations

import ctypes

import pytest

from ddtree_conformance import cuda_wait


class FakeDriver:
    """The four driver calls cuda_wait makes, over one device's primary-context flags."""

    def __init__(self, flags: int = 0x08) -> None:  # 0x08: CU_CTX_MAP_HOST, a bit that must survive
        self.flags, self.set_calls = flags, []

    def cuDeviceGet(self, device, index):  # noqa: N802 (the driver's names)
        device._obj.value = index
        return 0

    def cuDevicePrimaryCtxGetState(self, device, flags, active):  # noqa: N802
        flags._obj.value, active._obj.value = self.flags, 1
        return 0

    def cuDevicePrimaryCtxSetFlags_v2(self, device, flags):  # noqa: N802
        self.set_calls.append(flags)
        self.flags = flags
        return 0


@pytest.fixture
def driver(monkeypatch):
    fake = FakeDriver()
    monkeypatch.setattr(cuda_wait, "_driver", lambda: fake)
    return fake


def test_a_mode_sets_the_scheduling_bits_only_and_reads_back_by_name(driver):
    assert cuda_wait.current_wait("cuda") == "auto"
    assert cuda_wait.wait_for_gpu("blocking", "cuda:0") == "blocking"
    assert driver.flags == 0x08 | 0x04
    assert cuda_wait.wait_for_gpu("spin", "cuda") == "spin"
    assert driver.flags == 0x08 | 0x01  # blocking's bit cleared, the other bit kept


def test_a_cpu_run_is_left_alone_and_an_unknown_mode_is_refused(driver):
    assert cuda_wait.wait_for_gpu("blocking", "cpu") == "-"
    assert driver.set_calls == []
    with pytest.raises(ValueError, match="wait mode 'sleepy'"):
        cuda_wait.wait_for_gpu("sleepy", "cuda")


def test_a_driver_error_names_the_call(monkeypatch):
    fake = FakeDriver()
    fake.cuDevicePrimaryCtxSetFlags_v2 = lambda device, flags: 201  # CUDA_ERROR_INVALID_CONTEXT
    monkeypatch.setattr(cuda_wait, "_driver", lambda: fake)
    with pytest.raises(cuda_wait.CudaWaitError, match="cuDevicePrimaryCtxSetFlags returned CUDA error 201"):
        cuda_wait.wait_for_gpu("blocking", "cuda")


def test_without_a_driver_library_the_error_says_so(monkeypatch):
    cuda_wait._driver.cache_clear()
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: "libcuda-that-is-not-here.so")
    with pytest.raises(cuda_wait.CudaWaitError, match="no CUDA driver library"):
        cuda_wait.current_wait("cuda")
    cuda_wait._driver.cache_clear()
