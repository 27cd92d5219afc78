"""The probe: measure what a hook did to the gradient, against the exact average, in float64.

Inside the hook it only *copies* each rank's local gradients (and counts the bytes the hook
hands to collectives, :mod:`commhooks_lab.payload`); everything else happens after
``backward()``, in the main thread, with communication of its own that never mixes with the
hook's. So the hook does exactly what it would do unprobed, and the trained parameters are
bit-identical with the probe on or off. It also checks what the hook returns (the contract
DDP relies on) and says so in the learner's words before PyTorch fails somewhere deeper.

Definitions (for step t; g_r = rank r's local gradient, exact = mean_r g_r in float64,
h = the gradient the hook leaves in ``param.grad``):

- ``rel_error`` = ||h - exact|| / ||exact||,   ``cosine`` = <h, exact> / (||h|| ||exact||)
- ``max_abs_error`` = max |h - exact|
- ``payload_bytes``: numel x element size of every tensor this rank handed to a collective
- ``ring_bytes``: what a bandwidth-optimal algorithm sends from this rank: 2(W-1)/W x payload
  for all-reduce, (W-1) x payload for all-gather (every rule in :mod:`commhooks_lab.payload`)
- ``wire_bytes``: what the rank process really wrote during the backward pass (Linux)
- ``rank_spread`` = max over parameters of max |h_r - h_0|: 0 is DDP's invariant
- ``cumulative_rel_error`` = ||sum_t (h_t - exact_t)|| / ||sum_t exact_t||

Cost, as models grow: each step writes its local and hook gradients into one preallocated row
(the gradients' own dtype: exact, and no fresh memory to fault in); a flush sends the rows to
rank 0 point-to-point and rank 0 measures in float64 with dot products and min/max over
reused buffers: a few passes over the parameters, no per-element temporaries.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from .contract import check_returned, check_value, completed_future
from .payload import GATHER_OPS, PayloadCounter, unexplained_note, unexplained_wire, written_bytes
from .scratch import Scratch


def _row_dtype(params: list[torch.Tensor]) -> torch.dtype:
    """One dtype that holds every parameter's gradient exactly (their promotion)."""
    dtype = functools.reduce(torch.promote_types, (p.dtype for p in params), torch.float16)
    if not dtype.is_floating_point or dtype.itemsize > 8:
        return torch.float64
    return dtype


class Probe:
    """Wraps a hook; records each step; :meth:`flush` compares the records with the exact mean.

    Recording only copies tensors into a row per step: ``[loss (float64 bits) | local grads |
    hook grads]`` in the gradients' dtype. Measuring needs communication of its own, so rows
    wait and are sent to rank 0 together, at the end of a run or whenever they reach
    ``flush_bytes``. Every rank must call :meth:`flush` at the same points, which
    :meth:`should_flush` guarantees (same sizes on every rank). Only rank 0 returns rows.
    """

    def __init__(self, named_parameters, world_size: int, rank: int, measure: bool = True, flush_bytes: int = 32 << 20):
        self.names = [n for n, _ in named_parameters]
        self.params = [p for _, p in named_parameters]
        self.sizes = [p.numel() for p in self.params]
        self.offsets = [sum(self.sizes[:i]) for i in range(len(self.sizes))]
        self.n = sum(self.sizes)
        self.world_size, self.rank = world_size, rank
        self.measure_enabled = measure
        self.flush_bytes = flush_bytes
        self.counter = PayloadCounter.install()
        self.device = self.params[0].device if self.params else torch.device("cpu")
        self.dtype = _row_dtype(self.params)
        self._k = 8 // self.dtype.itemsize  # row elements that hold the loss's float64 bits
        width = self._k + (2 * self.n if measure else 0)
        self._width = -(-width // self._k) * self._k  # rows stay 8-byte aligned when stacked
        self._index = {id(p): i for i, p in enumerate(self.params)}
        self._row: torch.Tensor | None = None
        self._seen: set[int] = set()
        self.bucket_of: dict[int, int] = {}  # parameter index -> bucket it travelled in, last step
        self.uncompressed_bytes = 0
        self.buckets = 0
        self.records: list[dict] = []
        self.notes: list[str] = []
        self._wire_start: int | None = None
        self._wire_gaps: list[float] = []
        self._scratch = Scratch(self, self.device)
        self._last: tuple[torch.Tensor, torch.Tensor] | None = None

    # -- in the step --------------------------------------------------------------------------

    def wrap(self, hook: Callable, wait: bool = True) -> Callable:
        """A hook that records, runs ``hook`` unchanged, and checks what it returns.

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
                probe._record_local(bucket)
            future = hook(state, bucket)
            check_returned(hook, future)
            if not wait:
                return future.then(lambda fut: check_value(hook, fut.value(), bucket))
            return completed_future(check_value(hook, future.wait(), bucket))

        probed_hook.__wrapped__ = hook  # type: ignore[attr-defined]
        return probed_hook

    def _take_row(self) -> torch.Tensor:
        return self._scratch.take((self._width,), self.dtype)

    def _record_local(self, bucket) -> None:
        if self._row is None:
            self._row = self._take_row()
        row, start = self._row, self._k
        for param, grad in zip(bucket.parameters(), bucket.gradients()):
            i = self._index[id(param)]
            row[start + self.offsets[i] : start + self.offsets[i] + self.sizes[i]].copy_(grad.reshape(-1))
            self._seen.add(i)
            self.bucket_of[i] = bucket.index()

    def start_step(self) -> None:
        if self._row is None:
            self._row = self._take_row()
        self._seen.clear()
        self.uncompressed_bytes = 0
        self.buckets = 0
        self.counter.reset()
        self.counter.active = True
        self._wire_start = written_bytes()

    def end_step(self, loss: torch.Tensor) -> dict:
        """Call right after ``backward()``: stop counting, keep copies. Returns the step's record."""
        wire_end = written_bytes()
        counter = self.counter
        counter.active = False
        wire = wire_end - self._wire_start if wire_end is not None and self._wire_start is not None else math.nan
        self._wire_gaps.append(unexplained_wire(wire, counter.wire_bound, counter.messages))
        payload = counter.payload_bytes
        record: dict[str, Any] = {
            "payload_bytes": payload,
            "ring_bytes": counter.ring_bytes,
            "wire_bytes": wire,
            "allgather_bytes": sum(b for op, b in counter.bytes_by_op.items() if op in GATHER_OPS),
            "allgather_calls": sum(c for op, c in counter.calls.items() if op in GATHER_OPS),
            "collective_calls": sum(counter.calls.values()),
            "uncompressed_bytes": self.uncompressed_bytes,
            "buckets": self.buckets,
            "compressing": bool(0 < payload < self.uncompressed_bytes),
        }
        row = self._row if self._row is not None else self._take_row()
        self._row = None
        row[: self._k].view(torch.float64).copy_(loss.detach().reshape(1))
        if self.measure_enabled:
            missing = [name for i, name in enumerate(self.names) if i not in self._seen]
            if missing:
                self._scratch.give(row)
                raise RuntimeError(f"the probe saw no gradient for {missing}: were these parameters unused?")
            record["_buckets"] = [self.bucket_of[i] for i in range(len(self.params))]
            start = self._k + self.n
            for param, offset, size in zip(self.params, self.offsets, self.sizes):
                assert param.grad is not None  # every parameter was in a bucket
                row[start + offset : start + offset + size].copy_(param.grad.reshape(-1))
        record["_row"] = row
        self.records.append(record)
        return record

    def should_flush(self) -> bool:
        return len(self.records) * self._width * self.dtype.itemsize >= self.flush_bytes

    # -- after steps: measuring ---------------------------------------------------------------

    def flush(self) -> tuple[list[dict], list[dict]]:
        """Measure every recorded step; on rank 0 return (step rows, layer rows), elsewhere ([], []).

        Collective: every rank calls it at the same points.
        """
        records, self.records = self.records, []
        if not records:
            return [], []
        rows = [rec.pop("_row") for rec in records]
        packed = rows[0].view(1, -1) if len(rows) == 1 else torch.stack(rows)
        everyone = self._to_rank0(packed)
        try:
            if everyone is None:
                return [], []
            return self._measure_all(records, everyone)
        finally:
            for row in rows:
                self._scratch.give(row)

    def _buffer(self, name: str, shape: tuple, dtype: torch.dtype) -> torch.Tensor:
        """A scratch tensor kept between flushes (and runs): large fresh allocations cost more than the arithmetic."""
        return self._scratch.named(name, shape, dtype)

    def _to_rank0(self, packed: torch.Tensor) -> list[torch.Tensor] | None:
        """Every rank's rows on rank 0, in rank order (point-to-point: gloo's gather is several times slower)."""
        if self.world_size == 1:
            return [packed]
        if self.rank != 0:
            dist.send(packed, dst=0)
            return None
        received = [self._buffer(f"from{r}", tuple(packed.shape), packed.dtype) for r in range(1, self.world_size)]
        works = [dist.irecv(buffer, src=r) for r, buffer in enumerate(received, start=1)]
        for work in works:
            if work is not None:
                work.wait()
        return [packed, *received]

    def _measure_all(self, records: list[dict], everyone: list[torch.Tensor]) -> tuple[list[dict], list[dict]]:
        k, w = self._k, self.world_size
        losses = torch.stack([rows[:, :k].view(torch.float64)[:, 0] for rows in everyone]).sum(0) / w
        steps: list[dict] = []
        layers: list[dict] = []
        for i, (rec, loss) in enumerate(zip(records, losses.tolist())):
            row = {**rec, "loss": loss}
            if self.measure_enabled:
                buckets = row.pop("_buckets")
                step_layers = self._measure(row, [rows[i] for rows in everyone], last=i == len(records) - 1)
                layers.extend({"step": rec["step"], "bucket": b, **layer} for b, layer in zip(buckets, step_layers))
            steps.append(row)
        note = unexplained_note(self._wire_gaps)
        self.notes[:] = [n for n in self.notes if not n.startswith("wire_bytes:")] + ([note] if note else [])
        return steps, layers

    def _measure(self, row: dict, rows: list[torch.Tensor], last: bool) -> list[dict]:
        """One step: ``rows[r]`` is rank r's ``[loss | local | h]``. Fills ``row``, returns layer rows."""
        k, n, f64 = self._k, self.n, torch.float64
        local = [r[k : k + n] for r in rows]
        hooked = [r[k + n : k + 2 * n] for r in rows]
        h = hooked[0]
        # Mixed-dtype arithmetic is many times slower on CPU than a float64 copy plus float64 arithmetic.
        exact, diff = self._buffer("exact", (n,), f64).copy_(local[0]), self._buffer("diff", (n,), f64)
        for other in local[1:]:
            exact.add_(diff.copy_(other))  # in float64, in rank order
        exact.div_(self.world_size)
        diff.copy_(h)
        hh = [diff[o : o + size].dot(diff[o : o + size]) for o, size in zip(self.offsets, self.sizes)]
        diff.sub_(exact)
        scalars = []
        for offset, size, h_dot_h in zip(self.offsets, self.sizes, hh):
            d, e = diff[offset : offset + size], exact[offset : offset + size]
            if size == 0:
                scalars.extend([diff.new_zeros(())] * 5)
                continue
            low, high = torch.aminmax(d)
            scalars.extend([d.dot(d), e.dot(e), h_dot_h, torch.maximum(-low, high)])
            scalars.append(self._spread(hooked, offset, size))
        if not self._scratch.has("sum_diff"):
            self._buffer("sum_diff", (n,), f64).zero_()
            self._buffer("sum_exact", (n,), f64).zero_()
        sum_diff, sum_exact = self._buffer("sum_diff", (n,), f64), self._buffer("sum_exact", (n,), f64)
        sum_diff.add_(diff)
        sum_exact.add_(exact)
        scalars.extend([sum_diff.dot(sum_diff), sum_exact.dot(sum_exact)])
        values = torch.stack(scalars).tolist()
        if last:  # keep the last step for sample(): swap buffers rather than copy
            self._buffer("last_exact", (n,), f64)
            self._scratch.swap("exact", "last_exact")
            self._last = (self._buffer("last_h", (n,), h.dtype).copy_(h), exact)
        per_layer = [values[5 * i : 5 * i + 5] for i in range(len(self.sizes))]
        layers = [
            {
                "layer": name,
                "numel": size,
                **_errors(dd, ee, hh, mx),
                "rank_spread": spread,
                "exact_norm": math.sqrt(ee),
            }
            for name, size, (dd, ee, hh, mx, spread) in zip(self.names, self.sizes, per_layer)
        ]
        totals = [sum(v[j] for v in per_layer) for j in range(3)]
        row.update(_errors(totals[0], totals[1], totals[2], _max(v[3] for v in per_layer)))
        row["rank_spread"] = _max(v[4] for v in per_layer)
        row["cumulative_rel_error"] = _ratio(math.sqrt(values[-2]), math.sqrt(values[-1]))
        return layers

    def _spread(self, hooked: list[torch.Tensor], offset: int, size: int) -> torch.Tensor:
        """max_r max |h_r - h_0| over one parameter, in float64; ranks that agree bit for bit cost one compare."""
        h0 = hooked[0][offset : offset + size]
        spread = h0.new_zeros((), dtype=torch.float64)
        for other in hooked[1:]:
            theirs = other[offset : offset + size]
            if torch.equal(theirs, h0):
                continue
            gap = self._buffer("gap", (self.n,), torch.float64)[:size].copy_(theirs)
            gap.sub_(self._buffer("scratch", (self.n,), torch.float64)[:size].copy_(h0))
            low, high = torch.aminmax(gap)
            spread = torch.maximum(spread, torch.maximum(-low, high))
        return spread

    def sample(self, layer: str | None = None) -> dict:
        """The last measured step's hook and exact gradient of one layer (default: the largest matrix)."""
        if layer is None:
            matrices = [(p.numel(), n) for n, p in zip(self.names, self.params) if p.dim() >= 2]
            layer = max(matrices)[1] if matrices else self.names[0]
        if layer not in self.names or self._last is None:
            raise ValueError(f"no layer {layer!r}; layers: {self.names}")
        i = self.names.index(layer)
        h, exact = (t[self.offsets[i] : self.offsets[i] + self.sizes[i]] for t in self._last)
        shape = list(self.params[i].shape)
        return {"layer": layer, "shape": shape, "hook": h.double().tolist(), "exact": exact.tolist()}


def _max(values) -> float:
    """The largest value; NaN if any is NaN (as torch's max)."""
    values = list(values)
    return math.nan if any(math.isnan(v) for v in values) else max(values, default=0.0)


def _ratio(num: float, den: float) -> float:
    return num / den if den > 0 else (0.0 if num == 0 else math.inf)


def _errors(dd: float, ee: float, hh: float, max_abs: float) -> dict:
    """rel_error, cosine and max_abs_error from d.d, e.e and h.h (d = h - e): h.e = (h.h + e.e - d.d) / 2.

    Three dot products of a vector with itself, the cheapest pass there is; the cosine stays
    accurate to a few units in the last place of its magnitudes.
    """
    denom = math.sqrt(hh) * math.sqrt(ee)
    return {
        "rel_error": _ratio(math.sqrt(dd), math.sqrt(ee)),
        "cosine": (hh + ee - dd) / 2 / denom if denom > 0 else math.nan,
        "max_abs_error": max_abs,
    }
