"""The probe: measure what a hook did to the gradient, against the exact average, in float64.

Inside the hook it only *copies* each rank's local gradients (and counts the bytes the hook
hands to collectives, :mod:`commhooks_lab.measure.payload`); everything else happens after
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
  for all-reduce, (W-1) x payload for all-gather (every rule in :mod:`commhooks_lab.measure.payload`)
- ``intra_bytes``, ``inter_bytes``: ``ring_bytes`` on groups inside one node, and on groups that span nodes
- ``intra_hops``, ``inter_hops``: the sequential steps of those calls' algorithms, each one link latency
- ``wire_bytes``: what the rank process really wrote during the backward pass (Linux)
- ``rank_spread`` = max over parameters of max |h_r - h_0|: 0 is DDP's invariant
- ``cumulative_rel_error`` = ||sum_t (h_t - exact_t)|| / ||sum_t exact_t||

Cost, as models grow: each step copies its local and hook gradients into reused blocks, one
per rank's share of the parameters (in the gradients' own dtype: exact, and no fresh memory to
fault in). A flush hands each rank every rank's block of its share (one batch of point-to-point
sends; gloo's gather is several times slower), each rank measures its share in float64
(:mod:`commhooks_lab.measure.metrics`), and rank 0 receives five sums per parameter and step: the work
and the bytes are split W ways. ``python bench/probe.py`` prints what it costs per model size.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from ..hooks.contract import check_returned, check_value, completed_future
from .metrics import SUMS, ShareMeter, cumulative, metrics, shares
from .payload import GATHER_OPS, PayloadCounter, unexplained_note, unexplained_wire, written_bytes
from .scratch import Scratch

__all__ = ["Probe"]


#: What every rank sums over its steps, per level (:attr:`Probe.link_totals`).
LINK_COUNTS = ("intra_bytes", "inter_bytes", "intra_hops", "inter_hops")


def _row_dtype(params: list[torch.Tensor]) -> torch.dtype:
    """One dtype that holds every parameter's gradient exactly (their promotion)."""
    dtype = functools.reduce(torch.promote_types, (p.dtype for p in params), torch.float16)
    if not dtype.is_floating_point or dtype.itemsize > 8:
        return torch.float64
    return dtype


class Probe:
    """Wraps a hook; records each step; :meth:`flush` compares the records with the exact mean.

    Recording only copies tensors into reused memory, one block per rank's share of the
    parameters: ``block_q[step] = [local gradients | hook results]`` over share q (block 0 also
    holds the loss's float64 bits), in the gradients' dtype. Measuring needs communication of its
    own, so steps wait and are measured together, at the end of a run or whenever they reach
    ``flush_bytes``. Every rank must call :meth:`flush` at the same points, which
    :meth:`should_flush` guarantees (same sizes on every rank); a flush while :meth:`should_flush`
    is False is the run's last. Only rank 0 returns rows.
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
        self._k = 8 // self.dtype.itemsize  # elements that hold the loss's float64 bits
        self._shares = shares(self.sizes if measure else [0] * len(self.sizes), world_size)
        self._owner, self._local_at, self._h_at = [], [], []  # where each parameter's copies go
        self._widths = []
        for q, share in enumerate(self._shares):
            base = self._k if q == 0 else 0
            for i in range(share.first, share.stop):
                self._owner.append(q)
                self._local_at.append(base + self.offsets[i] - share.start)
                self._h_at.append(base + share.numel + self.offsets[i] - share.start)
            width = base + 2 * share.numel
            self._widths.append(-(-width // self._k) * self._k)  # steps stay 8-byte aligned
        self._step_bytes = sum(self._widths) * self.dtype.itemsize
        self._index = {id(p): i for i, p in enumerate(self.params)}
        self._seen: set[int] = set()
        self.bucket_of: dict[int, int] = {}  # parameter index -> bucket it travelled in, last step
        self.uncompressed_bytes = 0
        self.buckets = 0
        self.records: list[dict] = []
        #: this rank's sums over the steps flushed so far (since this probe was made): the network model's time
        #: for the busiest rank, not only rank 0 (whose records alone reach the notebook)
        self.link_totals: dict[str, float] = dict.fromkeys(LINK_COUNTS, 0.0)
        self.notes: list[str] = []
        self._wire_start: int | None = None
        self._wire_gaps: list[float] = []
        self._scratch = Scratch(self, self.device)
        self._capacity = max(1, -(-flush_bytes // self._step_bytes))  # steps a flush holds
        self._meter = ShareMeter(self._shares[rank], self.sizes, world_size, self._scratch)
        self._last: tuple[torch.Tensor, torch.Tensor] | None = None
        self.passthrough = False  # True: buckets skip the hook and the probe (a resumed run's layout step)
        self.first_step_check: Callable | None = None  # (state, bucket) -> None, before the hook, next step only

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
            if isinstance(bucket, tuple):  # compiled autograd: one (grad, param), the result left in grad
                return hook(state, bucket)
            buffer = bucket.buffer()
            if probe.passthrough:
                return completed_future(buffer)
            if probe.first_step_check is not None:
                probe.first_step_check(state, bucket)
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

    def _block(self, q: int) -> torch.Tensor:
        """Rank q's share of every step recorded since the last flush: (steps, width), reused."""
        return self._buffer(f"block{q}", (self._capacity, self._widths[q]), self.dtype)

    def _slot(self) -> int:
        """The row of the blocks this step writes; doubles the blocks when a caller flushes late."""
        slot = len(self.records)
        if slot >= self._capacity:
            old = [self._block(q).clone() for q in range(self.world_size)]
            self._capacity *= 2
            for q, rows in enumerate(old):
                self._block(q)[: len(rows)].copy_(rows)
        return slot

    def _record_local(self, bucket) -> None:
        slot = self._slot()
        for param, grad in zip(bucket.parameters(), bucket.gradients()):
            i = self._index[id(param)]
            at = self._local_at[i]
            self._block(self._owner[i])[slot, at : at + self.sizes[i]].copy_(grad.reshape(-1))
            self._seen.add(i)
            self.bucket_of[i] = bucket.index()

    def start_step(self) -> None:
        self._seen.clear()
        self.uncompressed_bytes = 0
        self.buckets = 0
        self.counter.reset()
        self.counter.active = True
        self._wire_start = written_bytes()

    def end_step(self, loss: torch.Tensor) -> dict:
        """Call right after ``backward()``: stop counting, keep copies. Returns the step's record."""
        self.first_step_check = None
        wire_end = written_bytes()
        counter = self.counter
        counter.active = False
        wire = wire_end - self._wire_start if wire_end is not None and self._wire_start is not None else math.nan
        self._wire_gaps.append(unexplained_wire(wire, counter.wire_bound, counter.messages))
        payload = counter.payload_bytes
        record: dict[str, Any] = {
            "payload_bytes": payload,
            "ring_bytes": counter.ring_bytes,
            "intra_bytes": counter.intra_bytes,  # ring_bytes on groups inside one node (payload.py)
            "inter_bytes": counter.inter_bytes,  # ring_bytes on groups that span nodes
            "intra_hops": counter.intra_hops,  # the ring's sequential steps on those groups, one latency each
            "inter_hops": counter.inter_hops,
            "wire_bytes": wire,
            "allgather_bytes": sum(b for op, b in counter.bytes_by_op.items() if op in GATHER_OPS),
            "allgather_calls": sum(c for op, c in counter.calls.items() if op in GATHER_OPS),
            "collective_calls": sum(counter.calls.values()),
            "uncompressed_bytes": self.uncompressed_bytes,
            "buckets": self.buckets,
            "compressing": bool(0 < payload < self.uncompressed_bytes),
        }
        slot = self._slot()
        self._block(0)[slot, : self._k].view(torch.float64).copy_(loss.detach().reshape(1))
        if self.measure_enabled:
            missing = [name for i, name in enumerate(self.names) if i not in self._seen]
            if missing:
                raise RuntimeError(f"the probe saw no gradient for {missing}: were these parameters unused?")
            record["_buckets"] = [self.bucket_of[i] for i in range(len(self.params))]
            for i, param in enumerate(self.params):
                assert param.grad is not None  # every parameter was in a bucket
                at = self._h_at[i]
                self._block(self._owner[i])[slot, at : at + self.sizes[i]].copy_(param.grad.reshape(-1))
        self.records.append(record)
        return record

    def count_into(self, record: dict, fn: Callable[..., dict]) -> None:
        """Run ``fn(uncounted)`` (a synchronisation after the optimizer step) and add the bytes and calls it hands
        to collectives to this step's ``record``, with what ``fn`` returns; ``uncounted()`` hides a reference."""
        counter = self.counter
        counter.reset()
        counter.active = True
        try:
            extra = fn(self._uncounted)
        finally:
            counter.active = False
        gathered = sum(b for op, b in counter.bytes_by_op.items() if op in GATHER_OPS)
        record["payload_bytes"] += counter.payload_bytes
        record["ring_bytes"] += counter.ring_bytes
        record["intra_bytes"] += counter.intra_bytes
        record["inter_bytes"] += counter.inter_bytes
        record["intra_hops"] += counter.intra_hops
        record["inter_hops"] += counter.inter_hops
        record["allgather_bytes"] += gathered
        record["allgather_calls"] += sum(c for op, c in counter.calls.items() if op in GATHER_OPS)
        record["collective_calls"] += sum(counter.calls.values())
        record["sync_bytes"] = counter.payload_bytes
        record.update(extra)

    @contextlib.contextmanager
    def _uncounted(self):
        active, self.counter.active = self.counter.active, False
        try:
            yield
        finally:
            self.counter.active = active

    def should_flush(self) -> bool:
        return len(self.records) * self._step_bytes >= self.flush_bytes

    def state_dict(self) -> dict:
        """The running sums behind ``cumulative_rel_error`` (call right after a flush): a checkpoint keeps them."""
        if self.records:
            raise RuntimeError("flush the probe before saving its state: recorded steps are not measured yet")
        return self._meter.state_dict()

    def load_state_dict(self, saved: dict) -> None:
        self._meter.load_state_dict(saved)

    # -- after steps: measuring ---------------------------------------------------------------

    def flush(self, final: bool | None = None) -> tuple[list[dict], list[dict]]:
        """Measure every recorded step; on rank 0 return (step rows, layer rows), elsewhere ([], []).

        Collective: every rank calls it at the same points. ``final``: the run is over, so the last
        step's gradients come to rank 0 for :meth:`sample` (by default: when :meth:`should_flush`
        did not ask for this flush, as a training loop only flushes early when it asks).
        """
        final = not self.should_flush() if final is None else final
        records, self.records = self.records, []
        for record in records:
            for key in LINK_COUNTS:
                self.link_totals[key] += record[key]
        out = self._measure_records(records) if records else ([], [])
        if self.measure_enabled and self._meter.last is not None and (final or self.world_size == 1):
            self._collect_last()
        return out

    def _buffer(self, name: str, shape: tuple, dtype: torch.dtype) -> torch.Tensor:
        """A scratch tensor kept between flushes (and runs): large fresh allocations cost more than the arithmetic."""
        return self._scratch.named(name, shape, dtype)

    def _measure_records(self, records: list[dict]) -> tuple[list[dict], list[dict]]:
        blocks = self._exchange(len(records))
        sums = None
        if self.measure_enabled:
            base, numel = (self._k if self.rank == 0 else 0), self._shares[self.rank].numel
            sums = [
                self._meter.measure(
                    [b[i, base : base + numel] for b in blocks],
                    [b[i, base + numel : base + 2 * numel] for b in blocks],
                    keep_last=i == len(records) - 1,
                )
                for i in range(len(records))
            ]
        everyone = self._sums_to_rank0(torch.stack(sums) if sums else None)
        if self.rank != 0:
            return [], []
        losses = torch.stack([b[:, : self._k].contiguous().view(torch.float64)[:, 0] for b in blocks])
        losses = losses.sum(0) / self.world_size
        steps: list[dict] = []
        layers: list[dict] = []
        per_rank = [part.tolist() for part in everyone] if everyone is not None else None
        for i, (record, loss) in enumerate(zip(records, losses.tolist())):
            row = {**record, "loss": loss}
            if per_rank is not None:
                buckets = row.pop("_buckets")
                step, step_layers = metrics(self.names, self.sizes, [v for part in per_rank for v in part[i][:-2]])
                row.update(step)
                row["cumulative_rel_error"] = cumulative(*(sum(part[i][j] for part in per_rank) for j in (-2, -1)))
                layers.extend({"step": record["step"], "bucket": b, **layer} for b, layer in zip(buckets, step_layers))
            steps.append(row)
        note = unexplained_note(self._wire_gaps)
        self.notes[:] = [n for n in self.notes if not n.startswith("wire_bytes:")] + ([note] if note else [])
        return steps, layers

    def _exchange(self, steps: int) -> list[torch.Tensor]:
        """Every rank's block for this rank's share, ``steps`` rows each, in rank order.

        One batch of sends and receives: NCCL would deadlock on two ranks that both send first.
        """
        mine = self._block(self.rank)[:steps]
        if self.world_size == 1:
            return [mine]
        ops = [
            dist.P2POp(dist.isend, self._block(q)[:steps], q)
            for q in range(self.world_size)
            if q != self.rank and self._widths[q]
        ]
        blocks = []
        for r in range(self.world_size):
            if r == self.rank:
                blocks.append(mine)
                continue
            blocks.append(self._buffer(f"from{r}", (self._capacity, self._widths[self.rank]), self.dtype)[:steps])
            if self._widths[self.rank]:
                ops.append(dist.P2POp(dist.irecv, blocks[-1], r))
        if ops:
            _wait(dist.batch_isend_irecv(ops))
        return blocks

    def _sums_to_rank0(self, mine: torch.Tensor | None) -> list[torch.Tensor] | None:
        """Every share's sums on rank 0, in rank order (parameter order, as the shares are contiguous)."""
        if mine is None or self.world_size == 1:
            return None if mine is None else [mine]
        if self.rank != 0:
            dist.send(mine, dst=0)
            return None
        everyone = [mine]
        works = []
        for q, share in enumerate(self._shares[1:], start=1):
            width = SUMS * (share.stop - share.first) + 2
            everyone.append(self._buffer(f"sums{q}", (self._capacity, width), torch.float64)[: mine.shape[0]])
            works.append(dist.irecv(everyone[-1], src=q))
        _wait(works)
        return everyone

    def _collect_last(self) -> None:
        """The run's last measured step, every share of it, on rank 0 for :meth:`sample`."""
        assert self._meter.last is not None
        if self.world_size == 1:
            self._last = self._meter.last
            return
        h, exact = self._meter.last
        if self.rank != 0:
            if h.numel():
                _wait([dist.isend(h, dst=0), dist.isend(exact, dst=0)])
            return
        full_h = self._buffer("sample_h", (self.n,), h.dtype)
        full_exact = self._buffer("sample_exact", (self.n,), torch.float64)
        works = []
        for q, share in enumerate(self._shares):
            part_h, part_exact = full_h[share.start : share.end], full_exact[share.start : share.end]
            if q == 0:
                part_h.copy_(h)
                part_exact.copy_(exact)
            elif share.numel:
                works += [dist.irecv(part_h, src=q), dist.irecv(part_exact, src=q)]
        _wait(works)
        self._last = (full_h, full_exact)

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
        return {"layer": layer, "shape": shape, "hook": h.tolist(), "exact": exact.tolist()}


def _wait(works) -> None:
    for work in works:
        if work is not None:
            work.wait()
