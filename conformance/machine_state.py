"""The machine's state beside the timings: GPU clocks, power, temperature and throttle reasons, host load.

A bench samples the machine once after every warm-up round and every timed repeat (never inside a timed
call, so sampling costs the timings nothing) with a :class:`Sampler`:

* **GPU** (CUDA devices), through NVML: the SM and memory clocks (MHz), power draw (W), temperature
  (deg C) and the active clock-throttle reasons (``sw_power_cap``, ``hw_slowdown``, ``sw_thermal``, ...).
  NVML is reached through ``pynvml`` (the ``nvidia-ml-py`` package, in the ``gpu`` extra) or, where that
  is not installed, through the driver's own ``libnvidia-ml.so.1`` with ctypes. Where neither works the
  report says ``"not sampled: <reason>"``; nothing fails for it;
* **host**: CPU busy share of the whole machine since the previous sample (``psutil.cpu_percent``), the
  share of it taken by *other* processes (the whole machine's less that of this process and every process
  under it, an isolated engine's worker included: a busy neighbour, never the engine under test), and the
  1-minute
  load average, with the core count.

:func:`summarise` turns the per-repeat samples into the report's ``machine`` part (medians, ranges, the
throttle reasons seen); :func:`drift` compares a baseline's summary with a trial's and names what moved
(an SM clock 5 % lower, 12 deg C hotter, a new throttle reason, a busier host), which the gate gives as
the likely cause of a slowdown; :func:`noise_causes` names what in one run's own state made its repeats
noisy (an A/B run has no baseline state to compare with). :func:`outside_causes` keeps only what the
build under test cannot have moved itself (other processes' CPU, lower GPU clocks, a new throttle
reason): with one of those the stored-baseline gate does not fail a slower run (a slower machine cannot
be told from a slower build).
:func:`steady` is the warm-up rule (``docs/reference/bench-and-gates.md``).
"""

from __future__ import annotations

import ctypes
import os
import statistics
import time
from collections.abc import Sequence

__all__ = [
    "Sampler",
    "THROTTLE_REASONS",
    "describe",
    "drift",
    "identity",
    "noise_causes",
    "outside_causes",
    "steady",
    "summarise",
]

# NVML clock-throttle (clock-event) reason bits, nvml.h
THROTTLE_REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
    0x100: "display_clocks_setting",
}
# what a steady, busy GPU shows anyway: not a cause of drift
BENIGN_REASONS = frozenset({"gpu_idle", "applications_clocks_setting", "display_clocks_setting"})
GPU_FIELDS = ("sm_clock_mhz", "mem_clock_mhz", "power_w", "temperature_c")


def _reasons(mask: int) -> list[str]:
    return [name for bit, name in THROTTLE_REASONS.items() if mask & bit]


class _Pynvml:
    def __init__(self, index: int, uuid: str | None) -> None:
        import pynvml  # nvidia-ml-py

        self.nv = pynvml
        pynvml.nvmlInit()
        handle = None
        if uuid:
            try:
                handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
            except Exception:  # noqa: BLE001 - fall back to the index
                handle = None
        self.handle = handle if handle is not None else pynvml.nvmlDeviceGetHandleByIndex(index)
        self.via = "NVML (pynvml)"

    def read(self) -> dict:
        nv, h = self.nv, self.handle
        throttle = (
            getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or nv.nvmlDeviceGetCurrentClocksThrottleReasons
        )
        return {
            "sm_clock_mhz": float(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),
            "mem_clock_mhz": float(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM)),
            "power_w": nv.nvmlDeviceGetPowerUsage(h) / 1000.0,
            "temperature_c": float(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)),
            "throttle": _reasons(int(throttle(h))),
        }


class _CtypesNvml:
    """The few NVML calls needed, straight from the driver's library (no Python package)."""

    def __init__(self, index: int, uuid: str | None) -> None:
        lib = ctypes.CDLL("libnvidia-ml.so.1")
        self.lib = lib
        self._ok(lib.nvmlInit_v2(), "nvmlInit_v2")
        handle = ctypes.c_void_p()
        found = 1
        if uuid:
            found = lib.nvmlDeviceGetHandleByUUID(uuid.encode(), ctypes.byref(handle))
        if found != 0:
            self._ok(lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(index), ctypes.byref(handle)), "handle")
        self.handle = handle
        self.throttle = getattr(lib, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
            lib, "nvmlDeviceGetCurrentClocksThrottleReasons"
        )
        self.via = "NVML (libnvidia-ml.so.1 through ctypes)"

    @staticmethod
    def _ok(code: int, what: str) -> None:
        if code != 0:
            raise OSError(f"{what} returned NVML error {code}")

    def _uint(self, fn, *args) -> int:
        out = ctypes.c_uint()
        self._ok(fn(self.handle, *args, ctypes.byref(out)), fn.__name__)
        return out.value

    def read(self) -> dict:
        lib = self.lib
        mask = ctypes.c_ulonglong()
        self._ok(self.throttle(self.handle, ctypes.byref(mask)), "throttle reasons")
        return {
            "sm_clock_mhz": float(self._uint(lib.nvmlDeviceGetClockInfo, ctypes.c_int(1))),  # NVML_CLOCK_SM
            "mem_clock_mhz": float(self._uint(lib.nvmlDeviceGetClockInfo, ctypes.c_int(2))),  # NVML_CLOCK_MEM
            "power_w": self._uint(lib.nvmlDeviceGetPowerUsage) / 1000.0,
            "temperature_c": float(self._uint(lib.nvmlDeviceGetTemperature, ctypes.c_int(0))),  # NVML_TEMPERATURE_GPU
            "throttle": _reasons(int(mask.value)),
        }


def _gpu_reader(device: str):
    """(reader, None) or (None, why not)."""
    if not device.startswith("cuda"):
        return None, f"not sampled: device {device} has no GPU"
    index = int(device.split(":", 1)[1]) if ":" in device else 0
    uuid = None
    try:
        import torch

        if torch.cuda.is_available():
            raw = str(getattr(torch.cuda.get_device_properties(index), "uuid", "") or "")
            uuid = raw if not raw or raw.startswith("GPU-") else f"GPU-{raw}"
    except Exception:  # noqa: BLE001 - the UUID only picks the right NVML device
        uuid = None
    reasons = []
    for kind in (_Pynvml, _CtypesNvml):
        try:
            reader = kind(index, uuid)
            reader.read()
            return reader, None
        except Exception as exc:  # noqa: BLE001 - every way NVML can be missing ends in a reason
            reasons.append(f"{kind.__name__.strip('_')}: {type(exc).__name__}: {exc}")
    return None, "not sampled: NVML not reachable (" + "; ".join(reasons) + "); install nvidia-ml-py"


def identity(device: str = "cpu") -> dict:
    """What tells one machine from another: host name, boot id, and the GPU's name and UUID."""
    import platform

    out: dict = {"hostname": platform.node()}
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            out["boot_id"] = fh.read().strip()
    except OSError:
        out["boot_id"] = None
    if device.startswith("cuda"):
        try:
            import torch

            index = int(device.split(":", 1)[1]) if ":" in device else 0
            props = torch.cuda.get_device_properties(index)
            out["gpu"] = props.name
            out["gpu_uuid"] = str(getattr(props, "uuid", "") or "")
        except Exception:  # noqa: BLE001 - identity is best effort
            pass
    return out


class Sampler:
    """One sample per call of :meth:`sample` (the bench calls it after each warm-up round and repeat)."""

    def __init__(self, device: str = "cpu") -> None:
        self.device = device
        self.identity = identity(device)
        self.gpu, self.gpu_missing = _gpu_reader(device)
        try:
            import psutil

            self._psutil = psutil
            psutil.cpu_percent(None)  # starts the interval the first sample reads
            self._own_times, self._own_wall = self._tree_times(), time.monotonic()
        except Exception:  # noqa: BLE001
            self._psutil = None

    @property
    def via(self) -> str:
        return self.gpu.via if self.gpu is not None else self.gpu_missing or ""

    def _tree_times(self) -> dict[int, float]:
        """CPU seconds so far of this process and every process under it (an isolated engine's worker is
        one: the build under test, never "another process")."""
        me = self._psutil.Process()
        out = {}
        for proc in [me, *me.children(recursive=True)]:
            try:
                times = proc.cpu_times()
                out[proc.pid] = times.user + times.system
            except self._psutil.Error:
                continue
        return out

    def _own_share(self, cores: int) -> float:
        """The share of the machine's CPU this process tree used since the previous sample, in percent (a
        process that started since then counts all its time; one that ended since then is lost)."""
        now, wall = self._tree_times(), time.monotonic()
        used = sum(t - self._own_times.get(pid, 0.0) for pid, t in now.items())
        elapsed = max(wall - self._own_wall, 1e-6)
        self._own_times, self._own_wall = now, wall
        return min(100.0, max(0.0, 100.0 * used / (elapsed * cores)))

    def sample(self) -> dict:
        out: dict = {}
        if self.gpu is not None:
            try:
                out["gpu"] = self.gpu.read()
            except Exception as exc:  # noqa: BLE001
                out["gpu"] = f"not sampled: {type(exc).__name__}: {exc}"
        host: dict = {"cores": os.cpu_count()}
        if self._psutil is not None:
            busy = float(self._psutil.cpu_percent(None))
            own = self._own_share(host["cores"] or 1)
            host["cpu_percent"] = busy
            host["others_cpu_percent"] = round(max(0.0, busy - own), 1)
        try:
            host["load1"] = os.getloadavg()[0]
        except OSError:
            pass
        out["host"] = host
        return out


def _stats(values: Sequence[float]) -> dict | None:
    values = [float(v) for v in values if isinstance(v, (int, float))]
    if not values:
        return None
    return {"median": round(statistics.median(values), 3), "min": round(min(values), 3), "max": round(max(values), 3)}


def summarise(samples: Sequence[dict], sampler: Sampler | None = None) -> dict:
    """The report's ``machine`` part from per-repeat samples (:meth:`Sampler.sample`)."""
    gpu_rows = [s["gpu"] for s in samples if isinstance(s.get("gpu"), dict)]
    out: dict = {"samples": len(samples)}
    if gpu_rows:
        gpu = {f: _stats([r.get(f) for r in gpu_rows]) for f in GPU_FIELDS}
        seen = sorted({name for r in gpu_rows for name in r.get("throttle", [])})
        gpu["throttle_reasons"] = seen
        gpu["throttled_share"] = round(
            sum(any(n not in BENIGN_REASONS for n in r.get("throttle", [])) for r in gpu_rows) / len(gpu_rows), 3
        )
        gpu["via"] = sampler.via if sampler is not None else None
        out["gpu"] = gpu
    else:
        why = next((s["gpu"] for s in samples if isinstance(s.get("gpu"), str)), None)
        out["gpu"] = why or (sampler.gpu_missing if sampler is not None else None) or "not sampled"
    hosts = [s.get("host") or {} for s in samples]
    out["host"] = {
        "cores": next((h.get("cores") for h in hosts if h.get("cores")), os.cpu_count()),
        "cpu_percent": _stats([h.get("cpu_percent") for h in hosts]),
        "others_cpu_percent": _stats([h.get("others_cpu_percent") for h in hosts]),
        "load1": _stats([h.get("load1") for h in hosts]),
    }
    return out


def describe(machine: dict | None) -> str:
    """One line for reports and gate output."""
    if not machine:
        return "machine state not recorded"
    gpu = machine.get("gpu")
    parts = []
    if isinstance(gpu, dict):

        def med(field: str, unit: str, fmt: str = "{:.0f}") -> str | None:
            st = gpu.get(field)
            if not st:
                return None
            text = fmt.format(st["median"]) + unit
            return text if st["min"] == st["max"] else f"{text} ({fmt.format(st['min'])}-{fmt.format(st['max'])})"

        for piece in (
            med("sm_clock_mhz", " MHz SM"),
            med("mem_clock_mhz", " MHz mem"),
            med("power_w", " W"),
            med("temperature_c", " C"),
        ):
            if piece:
                parts.append(piece)
        bad = [r for r in gpu.get("throttle_reasons", []) if r not in BENIGN_REASONS]
        parts.append(
            f"throttle {', '.join(bad)} in {gpu.get('throttled_share', 0):.0%} of samples" if bad else "no throttling"
        )
    else:
        parts.append(f"GPU {gpu}" if gpu else "GPU not sampled")
    host = machine.get("host") or {}
    cpu, load = host.get("cpu_percent"), host.get("load1")
    others = host.get("others_cpu_percent")
    if cpu:
        by_others = f", other processes {others['median']:.0f} %" if others else ""
        parts.append(f"host CPU {cpu['median']:.0f} % busy (max {cpu['max']:.0f} %{by_others})")
    if load:
        parts.append(f"load {load['median']:.2f} on {host.get('cores')} cores")
    return "; ".join(parts)


def drift(baseline: dict | None, trial: dict | None) -> list[str]:
    """What moved between the baseline's machine state and the trial's, in words (empty: nothing, or no
    state on one side). Thresholds: SM or memory clock 2 %, power 10 %, temperature 5 deg C, a throttle
    reason the baseline did not show, host CPU 25 points busier or load up by half the cores."""
    if not baseline or not trial:
        return []
    out = []
    g0, g1 = baseline.get("gpu"), trial.get("gpu")
    if isinstance(g0, dict) and isinstance(g1, dict):
        for field, unit, rel in (("sm_clock_mhz", "MHz", 0.02), ("mem_clock_mhz", "MHz", 0.02), ("power_w", "W", 0.10)):
            a, b = (g0.get(field) or {}).get("median"), (g1.get(field) or {}).get("median")
            if a and b and abs(b / a - 1) >= rel:
                out.append(
                    f"{field.split('_')[0].upper() if field != 'power_w' else 'power'} "
                    f"{'clock ' if 'clock' in field else ''}{a:.0f} -> {b:.0f} {unit} ({100 * (b / a - 1):+.1f} %)"
                )
        a, b = (g0.get("temperature_c") or {}).get("median"), (g1.get("temperature_c") or {}).get("median")
        if a is not None and b is not None and abs(b - a) >= 5:
            out.append(f"temperature {a:.0f} -> {b:.0f} C")
        new = sorted(set(g1.get("throttle_reasons", [])) - set(g0.get("throttle_reasons", [])) - BENIGN_REASONS)
        if new:
            out.append(f"throttling the baseline did not show: {', '.join(new)}")
    h0, h1 = baseline.get("host") or {}, trial.get("host") or {}
    c0, c1 = (h0.get("cpu_percent") or {}).get("median"), (h1.get("cpu_percent") or {}).get("median")
    if c0 is not None and c1 is not None and c1 - c0 >= 25:
        out.append(f"host CPU {c0:.0f} % -> {c1:.0f} % busy")
    l0, l1 = (h0.get("load1") or {}).get("median"), (h1.get("load1") or {}).get("median")
    cores = h1.get("cores") or h0.get("cores") or 1
    if l0 is not None and l1 is not None and l1 - l0 >= cores / 2:
        out.append(f"host load {l0:.1f} -> {l1:.1f} on {cores} cores")
    return out


def _median(part: dict, field: str) -> float | None:
    value = (part.get(field) or {}).get("median") if isinstance(part, dict) else None
    return float(value) if isinstance(value, (int, float)) else None


def outside_causes(baseline: dict | None, trial: dict | None) -> list[str]:
    """What slowed the machine between the baseline's state and the trial's that the build under test
    cannot have done itself, in words (empty: none seen, or no state on one side):

    * other processes busier by 25 points of the machine's CPU or more (the trial's other-process share;
      a trial recorded by an older suite gives only the whole machine's, this process included, and says so);
    * the SM or memory clock 2 % or more *lower*;
    * a throttle reason (power cap, thermal, hardware slowdown) the baseline did not show.

    A hotter GPU or a different power draw alone is not one: a slower or busier build moves them too."""
    if not baseline or not trial:
        return []
    out = []
    g0, g1 = baseline.get("gpu"), trial.get("gpu")
    if isinstance(g0, dict) and isinstance(g1, dict):
        for field, name in (("sm_clock_mhz", "SM"), ("mem_clock_mhz", "memory")):
            a, b = _median(g0, field), _median(g1, field)
            if a and b and b / a - 1 <= -0.02:
                out.append(f"{name} clock {a:.0f} -> {b:.0f} MHz ({100 * (b / a - 1):+.1f} %)")
        new = sorted(set(g1.get("throttle_reasons", [])) - set(g0.get("throttle_reasons", [])) - BENIGN_REASONS)
        if new:
            out.append(f"throttling the baseline did not show: {', '.join(new)}")
    h0, h1 = baseline.get("host") or {}, trial.get("host") or {}
    after = _median(h1, "others_cpu_percent")
    before = _median(h0, "others_cpu_percent")
    before = _median(h0, "cpu_percent") if before is None else before
    if after is not None and before is not None and after - before >= 25:
        out.append(f"other processes {before:.0f} % -> {after:.0f} % of the host CPU")
    elif after is None:
        whole = _median(h1, "cpu_percent")
        if whole is not None and before is not None and whole - before >= 25:
            out.append(f"host CPU {before:.0f} % -> {whole:.0f} % busy (this process included: an older record)")
    return out


def noise_causes(machine: dict | None) -> list[str]:
    """What in one run's own machine state (:func:`summarise`) spreads its repeats and that the build
    under test cannot have caused, in words (empty: none seen, or no state):

    * other processes at 25 % of the host's CPU or more (median over the repeats);
    * a throttle reason (power cap, thermal, hardware slowdown) in any sample;
    * the SM clock moving by 2 % or more between repeats.

    An A/B run interleaves both builds, so a slower machine slows both arms alike and cannot bias the
    ratio; it widens the interval. This names why an A/B interval came out too wide to decide."""
    if not machine:
        return []
    out = []
    host = machine.get("host") or {}
    others = _median(host, "others_cpu_percent")
    if others is not None and others >= 25:
        top = (host.get("others_cpu_percent") or {}).get("max", others)
        out.append(f"other processes kept {others:.0f} % of the host CPU busy (up to {top:.0f} %)")
    gpu = machine.get("gpu")
    if isinstance(gpu, dict):
        bad = [r for r in gpu.get("throttle_reasons", []) if r not in BENIGN_REASONS]
        if bad:
            out.append(f"GPU throttled ({', '.join(bad)}) in {gpu.get('throttled_share', 0):.0%} of the repeats")
        clock = gpu.get("sm_clock_mhz") or {}
        low, high = clock.get("min"), clock.get("max")
        if isinstance(low, (int, float)) and isinstance(high, (int, float)) and low > 0 and high / low - 1 >= 0.02:
            out.append(f"SM clock moved {low:.0f}-{high:.0f} MHz ({100 * (high / low - 1):.1f} %)")
    return out


def steady(
    times: Sequence[Sequence[float]],
    states: Sequence[dict] | None = None,
    *,
    window: int = 2,
    tolerance: float = 0.03,
    clock_tolerance: float = 0.01,
    temperature_c: float = 2.0,
) -> bool:
    """The warm-up rule: steady once the last ``window + 1`` warm-up rounds agree. ``times[j]`` holds every
    arm's decode seconds in round j; the rounds agree when each arm's largest of them is within
    ``tolerance`` of its smallest, and, where the GPU was sampled (``states[j]``, :meth:`Sampler.sample`),
    the SM clock within ``clock_tolerance`` and the temperature within ``temperature_c``."""
    if len(times) < window + 1:
        return False
    last = times[-(window + 1) :]
    for arm in range(len(last[0])):
        values = [row[arm] for row in last]
        if min(values) <= 0 or max(values) / min(values) - 1 > tolerance:
            return False
    gpus = [s.get("gpu") for s in (states or [])[-(window + 1) :]]
    if len(gpus) == window + 1 and all(isinstance(g, dict) for g in gpus):
        clocks = [g["sm_clock_mhz"] for g in gpus]
        temps = [g["temperature_c"] for g in gpus]
        if min(clocks) <= 0 or max(clocks) / min(clocks) - 1 > clock_tolerance:
            return False
        if max(temps) - min(temps) > temperature_c:
            return False
    return True
