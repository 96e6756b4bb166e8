"""Static KV caches and CUDA-graph replay: the reference engine's fast path.

An eager decode step of an 8B target is mostly Python and kernel launches (28-37 ms on an H200
where reading the weights takes about 3.4 ms), and that host time jitters with the machine. The
fast path removes it: every decode step and every verify round runs on KV caches of fixed
capacity, so its tensors keep their shapes and addresses from call to call, and on CUDA each shape
is captured once as a CUDA graph and replayed.

* :class:`StaticTargetCache`: the target's K/V in one buffer ``[layers, 2, 1, kv_heads, capacity,
  head_dim]``. To the model it is a cache whose ``update`` writes the new rows at the slots the
  caller set and returns the whole buffer (the attention mask hides the slots not in use); to the
  spec's compaction (``compact_dynamic_cache``) it looks like a transformers ``DynamicCache``
  (``layers[i].keys/values``, ``get_seq_length``), so any compaction step runs on it unchanged.
* :class:`StaticDraftCache`: the drafter's context K/V likewise (``extend`` as in ``DraftCache``).
* :class:`GraphRunner`: runs a function of static input buffers. Each key (a shape) has its own
  buffers; every call copies the new inputs into them in place (never rebinding them: a graph
  keeps reading the buffers it was captured with) and then replays the key's graph, capturing it on
  the first call. Without CUDA, or with graphs off, it calls the same function on the same buffers
  eagerly, so the CPU runs exactly the logic the graphs replay. A capture that fails turns graphs
  off for that runner and says why (:attr:`GraphRunner.failure`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["GraphRunner", "StaticDraftCache", "StaticTargetCache", "capacity_for", "fill_in_place"]

MIN_CAPACITY = 256


def capacity_for(tokens: int) -> int:
    """The cache capacity for ``tokens`` positions: the next power of two, at least ``MIN_CAPACITY``
    (few capacities, so few graphs, across requests of different lengths)."""
    capacity = MIN_CAPACITY
    while capacity < tokens:
        capacity *= 2
    return capacity


def fill_in_place(static: dict[str, torch.Tensor], name: str, value: torch.Tensor) -> None:
    """Copy one new input into its static buffer in place (what a captured graph reads)."""
    static[name].copy_(value, non_blocking=True)


class _LayerView:
    """One layer's ``keys``/``values`` as a ``DynamicCache`` layer shows them (views of the buffer)."""

    __slots__ = ("keys", "values")

    def __init__(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        self.keys, self.values = keys, values


class StaticTargetCache:
    """The target's K/V in one fixed buffer (module doc). ``length`` is the number of rows in use."""

    def __init__(
        self, layers: int, kv_heads: int, head_dim: int, capacity: int, dtype: torch.dtype, device: torch.device
    ) -> None:
        self.capacity = capacity
        self.buffer = torch.zeros((layers, 2, 1, kv_heads, capacity, head_dim), dtype=dtype, device=device)
        self._keys = [self.buffer[i, 0] for i in range(layers)]
        self._values = [self.buffer[i, 1] for i in range(layers)]
        self.layers = [_LayerView(k, v) for k, v in zip(self._keys, self._values)]
        self.slots: torch.Tensor | None = None  # where update() writes; set by the caller per forward
        self.length = 0

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        """Write the new rows at :attr:`slots`; the whole buffer is what the attention reads."""
        keys, values = self._keys[layer_idx], self._values[layer_idx]
        keys.index_copy_(2, self.slots, key_states)
        values.index_copy_(2, self.slots, value_states)
        return keys, values

    def get_seq_length(self, *args, **kwargs) -> int:
        return int(self.layers[0].keys.shape[2]) if self.layers[0].keys is not self._keys[0] else self.length

    def load(self, cache) -> None:
        """Start from a transformers ``DynamicCache`` (the prefill's): its rows become slots 0..n-1."""
        n = cache.layers[0].keys.shape[2]
        for i, layer in enumerate(cache.layers):
            self._keys[i][:, :, :n].copy_(layer.keys)
            self._values[i][:, :, :n].copy_(layer.values)
        self.length = int(n)

    def show_rows(self) -> None:
        """Make ``layers[i].keys/values`` the rows in use, as a ``DynamicCache`` would hold them."""
        for view, keys, values in zip(self.layers, self._keys, self._values):
            view.keys, view.values = keys[:, :, : self.length], values[:, :, : self.length]

    def rows_shown(self) -> int:
        """After a step changed the shown rows (compaction): take their length and show the buffer again."""
        length = int(self.layers[0].keys.shape[2])
        for view, keys, values in zip(self.layers, self._keys, self._values):
            view.keys, view.values = keys, values
        self.length = length
        return length

    def keep_rows(self, start: int, rows: list[int]) -> None:
        """The spec's compaction (``compact_dynamic_cache``) for every layer at once: rows ``start + rows[i]``
        move to ``start + i``, and the cache ends there."""
        source = torch.tensor([start + r for r in rows], dtype=torch.long).to(self.buffer.device, non_blocking=True)
        self.buffer[:, :, :, :, start : start + len(rows)] = self.buffer.index_select(4, source)
        self.length = start + len(rows)


class StaticDraftCache:
    """The drafter's context K/V in fixed buffers ``[1, kv_heads, capacity + tail, head_dim]`` per layer.
    ``extend`` writes the new context rows at :attr:`slots` and returns the first ``capacity`` rows (the
    drafter's module then appends the block's own K/V); ``extend_with_block`` also writes the block's K/V
    into the ``tail`` rows after them and returns the whole buffer (:class:`~.lean.LeanDFlash`: no copy)."""

    def __init__(
        self,
        layers: int,
        kv_heads: int,
        head_dim: int,
        capacity: int,
        dtype: torch.dtype,
        device: torch.device,
        tail: int = 0,
    ) -> None:
        self.capacity = capacity
        shape = (1, kv_heads, capacity + tail, head_dim)
        self.full_keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.full_values = [torch.zeros_like(k) for k in self.full_keys]
        self.keys = [k[:, :, :capacity] for k in self.full_keys]
        self.values = [v[:, :, :capacity] for v in self.full_values]
        self.slots: torch.Tensor | None = None

    def extend(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.keys[layer].index_copy_(2, self.slots, k)
        self.values[layer].index_copy_(2, self.slots, v)
        return self.keys[layer], self.values[layer]

    def extend_with_block(
        self, layer: int, k: torch.Tensor, v: torch.Tensor, context_rows: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``k``/``v``: ``[1, kv_heads, C + S, head_dim]``, the C new context rows then the block's S."""
        self.extend(layer, k[:, :, :context_rows], v[:, :, :context_rows])
        end = self.capacity + k.shape[2] - context_rows
        self.full_keys[layer][:, :, self.capacity : end] = k[:, :, context_rows:]
        self.full_values[layer][:, :, self.capacity : end] = v[:, :, context_rows:]
        return self.full_keys[layer][:, :, :end], self.full_values[layer][:, :, :end]


@dataclass
class _Entry:
    static: dict[str, torch.Tensor]
    graph: Any = None
    outputs: Any = None


@dataclass
class GraphRunner:
    """Functions of static buffers, replayed as CUDA graphs per key (module doc).

    ``capture``: capture graphs (CUDA only); otherwise every call runs eagerly on the buffers.
    ``limit``: graphs kept (least recently used dropped first).
    """

    device: torch.device
    capture: bool
    limit: int = 64
    captures: int = 0
    replays: int = 0
    eager_calls: int = 0
    failure: str | None = None
    _entries: OrderedDict = field(default_factory=OrderedDict)

    def __post_init__(self) -> None:
        self.capture = bool(self.capture and self.device.type == "cuda")

    def run(
        self,
        key,
        fn: Callable[[dict[str, torch.Tensor]], Any],
        inputs: dict[str, torch.Tensor],
        *,
        fill: Callable[[dict, str, torch.Tensor], None] = fill_in_place,
        capture: bool = True,
    ):
        """``fn(static)`` on ``key``'s buffers holding ``inputs``; a graph replay where one is captured.

        ``fill(static, name, value)`` puts each input into its buffer (in place); ``capture=False``
        runs this call eagerly (shapes seen once per request, such as the first draft after a prefill).
        What ``fn`` returns lives in the key's buffers until the key runs again."""
        entry = self._entries.get(key)
        if entry is None:
            entry = _Entry({name: value.to(self.device, copy=True) for name, value in inputs.items()})
            self._entries[key] = entry
            while len(self._entries) > self.limit:
                self._entries.popitem(last=False)
        else:
            self._entries.move_to_end(key)
            for name, value in inputs.items():
                fill(entry.static, name, value)
        if entry.graph is not None:
            entry.graph.replay()
            self.replays += 1
            return entry.outputs
        if not (self.capture and capture):
            self.eager_calls += 1
            return fn(entry.static)
        return self._capture(entry, fn)

    def _capture(self, entry: _Entry, fn):
        # warm-up on a side stream (library handles, workspaces), then capture; fn only writes the
        # slots its inputs name, so running it again is harmless
        current = torch.cuda.current_stream(self.device)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(current)
        with torch.cuda.stream(side):
            fn(entry.static)
        current.wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                outputs = fn(entry.static)
        except RuntimeError as exc:  # graphs off from here on; this call runs eagerly
            self.failure = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
            self.capture = False
            self.eager_calls += 1
            return fn(entry.static)
        entry.graph, entry.outputs = graph, outputs
        self.captures += 1
        graph.replay()
        self.replays += 1
        return outputs

    def clear(self) -> None:
        self._entries.clear()
