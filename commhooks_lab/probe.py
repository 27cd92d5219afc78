"""The probe: measure what a hook did to the gradient, against the exact average, in float64.

Inside the hook it only *copies* each rank's local gradients (and counts the bytes the hook
hands to collectives); everything else happens after ``backward()``, in the main thread, with
collectives of its own that never mix with the hook's. So the hook does exactly what it would
do unprobed, and the trained parameters are bit-identical with the probe on or off.

Definitions (for step t; g_r = rank r's local gradient, exact = mean_r g_r in float64,
h = the gradient the hook leaves in ``param.grad``):

- ``rel_error`` = ||h - exact|| / ||exact||,   ``cosine`` = <h, exact> / (||h|| ||exact||)
- ``max_abs_error`` = max |h - exact|
- ``payload_bytes``: numel x element size of every tensor this rank handed to a collective
- ``ring_bytes``: what a ring algorithm puts on this rank's link: 2(W-1)/W x payload for
  all-reduce, (W-1) x payload for all-gather
- ``rank_spread`` = max over parameters of max |h_r - h_0|: 0 is DDP's invariant
- ``cumulative_rel_error`` = ||sum_t h_t - sum_t exact_t|| / ||sum_t exact_t||
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

# Which positional argument of each collective is the tensor this rank hands in, and how many
# payloads a ring algorithm moves over one rank's link, as a function of world size W.
_COLLECTIVES: dict[str, tuple[int, Callable[[int], float]]] = {
    "all_reduce": (0, lambda w: 2 * (w - 1) / w),
    "broadcast": (0, lambda w: 1.0),
    "all_gather": (1, lambda w: float(w - 1)),
    "all_gather_into_tensor": (1, lambda w: float(w - 1)),
    "reduce_scatter_tensor": (1, lambda w: (w - 1) / w),
    "all_to_all_single": (1, lambda w: (w - 1) / w),
}


class PayloadCounter:
    """Counts the bytes handed to ``torch.distributed`` collectives while ``active``.

    It patches the module's functions once per process, so hooks that call ``dist.all_reduce``
    (PyTorch's, Accelerate's, yours), also from ``.then()`` callbacks on gloo's threads, are
    all seen. DDP's built-in C++ allreduce is not: the lab measures ``no`` through
    ``allreduce_hook``, which gives bit-identical gradients.
    """

    _installed: PayloadCounter | None = None

    def __init__(self) -> None:
        self.active = False
        self.payload_bytes = 0
        self.ring_bytes = 0.0
        self.calls: dict[str, int] = {}
        self.bytes_by_op: dict[str, int] = {}
        self._lock = threading.Lock()

    @classmethod
    def install(cls) -> PayloadCounter:
        if cls._installed is None:
            counter = cls()
            for name, (position, ring_factor) in _COLLECTIVES.items():
                original = getattr(dist, name, None)
                if original is not None:
                    setattr(dist, name, counter._counting(name, original, position, ring_factor))
            cls._installed = counter
        return cls._installed

    def _counting(self, name, original, position, ring_factor):
        def collective(*args, **kwargs):
            if self.active:
                tensor = (
                    args[position]
                    if len(args) > position
                    else next((v for v in kwargs.values() if isinstance(v, torch.Tensor)), None)
                )
                if isinstance(tensor, torch.Tensor):
                    size = tensor.numel() * tensor.element_size()
                    group = kwargs.get("group")
                    world = dist.get_world_size(group)
                    with self._lock:
                        self.payload_bytes += size
                        self.ring_bytes += ring_factor(world) * size
                        self.calls[name] = self.calls.get(name, 0) + 1
                        self.bytes_by_op[name] = self.bytes_by_op.get(name, 0) + size
            return original(*args, **kwargs)

        collective.__wrapped__ = original  # type: ignore[attr-defined]
        collective.__name__ = name
        return collective

    def reset(self) -> None:
        with self._lock:
            self.payload_bytes, self.ring_bytes, self.calls, self.bytes_by_op = 0, 0.0, {}, {}


class Probe:
    """Wraps a hook; records each step; :meth:`flush` compares the records with the exact mean.

    Recording only copies tensors. Measuring needs collectives of its own, and on gloo each
    costs about a millisecond, as much as a small model's whole step: so records wait, and one
    float64 all-reduce (plus one max) measures many steps at once, at the end of a run or
    whenever the records reach ``flush_bytes``. Every rank must call :meth:`flush` at the same
    points, which :meth:`should_flush` guarantees (same sizes on every rank).
    """

    def __init__(self, named_parameters, world_size: int, rank: int, measure: bool = True, flush_bytes: int = 32 << 20):
        self.names = [n for n, _ in named_parameters]
        self.params = [p for _, p in named_parameters]
        self.sizes = [p.numel() for p in self.params]
        self.world_size, self.rank = world_size, rank
        self.measure_enabled = measure
        self.flush_bytes = flush_bytes
        self.counter = PayloadCounter.install()
        self.local: dict[int, torch.Tensor] = {}
        self.bucket_of: dict[int, int] = {}  # which bucket each parameter travelled in, last step
        self.uncompressed_bytes = 0
        self.buckets = 0
        self.records: list[dict] = []
        self.sum_h: torch.Tensor | None = None
        self.sum_exact: torch.Tensor | None = None
        self.last: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def wrap(self, hook: Callable, wait: bool = True) -> Callable:
        """A hook that records, then runs ``hook`` unchanged.

        ``wait``: finish this bucket's communication before DDP moves on. On gloo, collectives
        that a hook starts in ``.then()`` callbacks run on gloo's threads and can interleave in
        a different order on each rank once a model spans several buckets; gloo then aborts
        ("Received data size doesn't match expected size"). Waiting keeps every rank in order.
        """
        probe = self

        def probed_hook(state, bucket):  # DDP checks that the second argument is named 'bucket'
            buffer = bucket.buffer()
            probe.uncompressed_bytes += buffer.numel() * buffer.element_size()
            probe.buckets += 1
            if probe.measure_enabled:
                for param, grad in zip(bucket.parameters(), bucket.gradients()):
                    probe.local[id(param)] = grad.detach().clone()
                    probe.bucket_of[id(param)] = bucket.index()
            future = hook(state, bucket)
            if not wait:
                return future
            done: torch.futures.Future = torch.futures.Future()
            done.set_result(future.wait())
            return done

        probed_hook.__wrapped__ = hook  # type: ignore[attr-defined]
        return probed_hook

    def start_step(self) -> None:
        self.local.clear()
        self.uncompressed_bytes = 0
        self.buckets = 0
        self.counter.reset()
        self.counter.active = True

    def end_step(self, loss: torch.Tensor) -> dict:
        """Call right after ``backward()``: stop counting, keep copies. Returns the step's record."""
        self.counter.active = False
        payload, counter = self.counter.payload_bytes, self.counter
        gather_ops = ("all_gather", "all_gather_into_tensor")
        record: dict[str, Any] = {
            "payload_bytes": payload,
            "ring_bytes": counter.ring_bytes,
            "allgather_bytes": sum(counter.bytes_by_op.get(op, 0) for op in gather_ops),
            "allgather_calls": sum(counter.calls.get(op, 0) for op in gather_ops),
            "collective_calls": sum(counter.calls.values()),
            "uncompressed_bytes": self.uncompressed_bytes,
            "buckets": self.buckets,
            "compressing": bool(0 < payload < self.uncompressed_bytes),
            "_loss": loss.detach().double().item(),
        }
        if self.measure_enabled:
            missing = [n for n, p in zip(self.names, self.params) if id(p) not in self.local]
            if missing:
                raise RuntimeError(f"the probe saw no gradient for {missing}: were these parameters unused?")
            record["_buckets"] = [self.bucket_of[id(p)] for p in self.params]
            record["_local"] = _flat(self.local[id(p)] for p in self.params)
            record["_h"] = _flat(p.grad for p in self.params)
        self.records.append(record)
        return record

    def should_flush(self) -> bool:
        return len(self.records) * 16 * sum(self.sizes) >= self.flush_bytes

    def flush(self) -> tuple[list[dict], list[dict]]:
        """Measure every recorded step; return (step rows, layer rows). Collective: all ranks call it."""
        records, self.records = self.records, []
        if not records:
            return [], []
        n = sum(self.sizes) if self.measure_enabled else 0
        packed = torch.zeros(len(records), 2 * n + 1, dtype=torch.float64)
        for i, rec in enumerate(records):
            packed[i, -1] = rec.pop("_loss")
            if self.measure_enabled:
                packed[i, :n] = rec["_local"]
                if self.rank == 0:
                    packed[i, n : 2 * n] = rec["_h"]
        dist.all_reduce(packed)  # sum of local gradients, rank 0's h, sum of losses: one collective
        steps: list[dict] = []
        layers: list[dict] = []
        if self.measure_enabled:
            exact_all, h0_all = packed[:, :n] / self.world_size, packed[:, n : 2 * n]
            spread = torch.stack(
                [
                    torch.stack([d.abs().max() for d in (rec.pop("_h") - h0).split(self.sizes)])
                    for rec, h0 in zip(records, h0_all)
                ]
            )
            dist.all_reduce(spread, op=dist.ReduceOp.MAX)
        for i, rec in enumerate(records):
            rec.pop("_local", None)
            row = {**rec, "loss": packed[i, -1].item() / self.world_size}
            if self.measure_enabled:
                step_layers = self._measure(row, exact_all[i], h0_all[i], spread[i])
                buckets = row.pop("_buckets")
                layers.extend({"step": rec["step"], "bucket": b, **layer} for b, layer in zip(buckets, step_layers))
            steps.append(row)
        return steps, layers

    def _measure(self, row: dict, exact: torch.Tensor, h: torch.Tensor, spread: torch.Tensor) -> list[dict]:
        diff = h - exact
        layers = []
        for name, size, d, e, hh, s in zip(
            self.names, self.sizes, diff.split(self.sizes), exact.split(self.sizes), h.split(self.sizes), spread
        ):
            layers.append(
                {
                    "layer": name,
                    "numel": size,
                    **_errors(d, e, hh),
                    "rank_spread": s.item(),
                    "exact_norm": e.norm().item(),
                }
            )
        self.last = dict(zip(self.names, zip(h.split(self.sizes), exact.split(self.sizes))))
        if self.sum_h is None or self.sum_exact is None:
            self.sum_h, self.sum_exact = torch.zeros_like(h), torch.zeros_like(exact)
        self.sum_h += h
        self.sum_exact += exact
        row.update(_errors(diff, exact, h))
        row["rank_spread"] = spread.max().item()
        row["cumulative_rel_error"] = _ratio((self.sum_h - self.sum_exact).norm(), self.sum_exact.norm())
        return layers

    def sample(self, layer: str | None = None) -> dict:
        """The last measured step's hook and exact gradient of one layer (default: the largest matrix)."""
        if layer is None:
            matrices = [(p.numel(), n) for n, p in zip(self.names, self.params) if p.dim() >= 2]
            layer = max(matrices)[1] if matrices else self.names[0]
        if layer not in self.last:
            raise ValueError(f"no layer {layer!r}; layers: {self.names}")
        h, exact = self.last[layer]
        shape = list(self.params[self.names.index(layer)].shape)
        return {"layer": layer, "shape": shape, "hook": h.tolist(), "exact": exact.tolist()}


def _flat(tensors) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1).to(torch.float64) for t in tensors])


def _ratio(num: torch.Tensor, den: torch.Tensor) -> float:
    return (num / den).item() if den > 0 else (0.0 if num == 0 else float("inf"))


def _errors(diff: torch.Tensor, exact: torch.Tensor, h: torch.Tensor) -> dict:
    denom = h.norm() * exact.norm()
    return {
        "rel_error": _ratio(diff.norm(), exact.norm()),
        "cosine": (h @ exact / denom).item() if denom > 0 else float("nan"),
        "max_abs_error": diff.abs().max().item(),
    }
