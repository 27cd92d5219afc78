"""Compressors beyond PyTorch's hooks, each a few lines behind one small interface.

A compressor turns one gradient tensor into a *payload* (a list of tensors: values, indices,
scales, bits) and back. It says how payloads meet: ``summable`` payloads (the same indices on
every rank) are all-reduced, the rest are all-gathered and decoded rank by rank.
:func:`compressor_hook`, with the state :func:`make_state` builds, runs any compressor as a DDP
communication hook, and :class:`ErrorFeedback` wraps any compressor with a per-parameter memory
of what it failed to send (Seide et al. 2014; Karimireddy et al. 2019), so every compressor can
be compared with and without it. That memory lives in the hook state (:class:`CompressorState`),
as PyTorch's ``PowerSGDState`` keeps its error dict: compressor objects stay stateless, so one
object can serve many runs.

Device-agnostic: every tensor a compressor makes (random draws included) lives on the
gradient's device, so the same code runs on gloo/CPU and NCCL/GPU.

The payload is what is really sent: indices, scales and packed bits count; all-gathered
copies show in ``ring_bytes`` ((W-1) x payload per rank). Each compressor states its own byte rule
beside its code: :meth:`Compressor.payload_bytes` for a tensor of a given shape, and how many payload
dtypes (one all-gather each) it sends; its registry record (``compressor_entries``) reads them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from .. import _compat
from .contract import completed_future
from .traffic import Shape, numel

__all__ = [
    "average_compressed",
    "Compressor",
    "compressor_hook",
    "CompressorState",
    "ErrorFeedback",
    "Int8PerChannel",
    "make_state",
    "pack_signs",
    "QSGD",
    "RandomK",
    "ScaledSign",
    "TernGrad",
    "TopK",
    "unpack_signs",
    "Where",
]


@dataclass(frozen=True)
class Where:
    """Which tensor is being compressed, and when: seeds randomness reproducibly."""

    key: int  # the parameter's position among those the hook has seen (the same on every rank)
    step: int
    rank: int
    seed: int = 0

    def generator(self, shared: bool, device: torch.device | str = "cpu") -> torch.Generator:
        """``shared``: the same stream on every rank (random-k's indices); else per rank (dithering).

        On ``device``, so draws happen where the gradient lives (the same numbers on every rank of
        one device type; CPU and CUDA generators give different streams).
        """
        rank = 0 if shared else self.rank + 1
        return torch.Generator(device=device).manual_seed(hash((self.seed, self.step, self.key, rank)) % (2**63))


class Compressor:
    """encode(x) -> payload tensors; decode(payload) -> a tensor shaped like x. Stateless."""

    name = "identity"
    summable = False  # can payloads from different ranks be summed element-wise?
    payload_dtypes = 1  # how many dtypes its payload holds: one all-gather each, per bucket

    def payload_bytes(self, shape: Shape) -> int:
        """The bytes :meth:`encode` makes for a float32 tensor of ``shape``: its byte rule."""
        return 4 * numel(shape)

    def encode(self, x: torch.Tensor, where: Where) -> list[torch.Tensor]:
        return [x.clone()]

    def compress(self, x: torch.Tensor, where: Where, memory: dict[int, torch.Tensor]) -> list[torch.Tensor]:
        """What the hook calls: ``encode``, plus any memory the compressor keeps in the hook state's ``memory``."""
        return self.encode(x, where)

    def decode(self, payload: list[torch.Tensor], like: torch.Tensor, where: Where) -> torch.Tensor:
        return payload[0].view_as(like)

    def __repr__(self) -> str:
        return f"<compressor {self.name}>"


def _k(numel: int, ratio: float) -> int:
    return max(1, min(numel, math.ceil(ratio * numel)))


def _scatter(values: torch.Tensor, indices: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    out = torch.zeros(like.numel(), dtype=like.dtype, device=like.device)
    out[indices.long()] = values
    return out.view_as(like)


class TopK(Compressor):
    """Send the k = ratio x numel largest-magnitude entries: values and their int32 indices."""

    def __init__(self, ratio: float = 0.01):
        if not 0 < ratio <= 1:
            raise ValueError(f"TopK ratio must be in (0, 1], got {ratio}")
        self.ratio, self.name = ratio, f"topk {ratio:.0%}"

    payload_dtypes = 2

    def payload_bytes(self, shape):
        return 8 * _k(numel(shape), self.ratio)  # a float32 value and an int32 index per entry kept

    def encode(self, x, where):
        flat = x.reshape(-1)
        indices = flat.abs().topk(_k(flat.numel(), self.ratio), sorted=False).indices
        return [flat[indices].clone(), indices.to(torch.int32)]

    def decode(self, payload, like, where):
        return _scatter(payload[0], payload[1], like)


class RandomK(Compressor):
    """Send k random entries; every rank draws the same indices from a shared seed, so only
    the values travel and they can be all-reduced."""

    summable = True

    def __init__(self, ratio: float = 0.01):
        if not 0 < ratio <= 1:
            raise ValueError(f"RandomK ratio must be in (0, 1], got {ratio}")
        self.ratio, self.name = ratio, f"randomk {ratio:.0%}"

    def payload_bytes(self, shape):
        return 4 * _k(numel(shape), self.ratio)  # the values alone: every rank draws the same indices

    def _indices(self, numel, where, device):
        generator = where.generator(shared=True, device=device)
        return torch.randperm(numel, generator=generator, device=device)[: _k(numel, self.ratio)]

    def encode(self, x, where):
        return [x.reshape(-1)[self._indices(x.numel(), where, x.device)].clone()]

    def decode(self, payload, like, where):
        return _scatter(payload[0], self._indices(like.numel(), where, like.device), like)


def _bit_weights(device: torch.device) -> torch.Tensor:
    return torch.tensor([128, 64, 32, 16, 8, 4, 2, 1], dtype=torch.uint8, device=device)


def pack_signs(x: torch.Tensor) -> torch.Tensor:
    """One bit per entry (1 for x >= 0), eight to a byte."""
    bits = (x.reshape(-1) >= 0).to(torch.uint8)
    bits = torch.cat([bits, bits.new_zeros(-len(bits) % 8)]).view(-1, 8)
    return (bits * _bit_weights(x.device)).sum(dim=1, dtype=torch.uint8)


def unpack_signs(packed: torch.Tensor, numel: int) -> torch.Tensor:
    bits = (packed.view(-1, 1) & _bit_weights(packed.device)).ne(0).view(-1)[:numel]
    return bits.to(torch.float32) * 2 - 1


class ScaledSign(Compressor):
    """sign(x) x mean|x|: one bit per entry plus one float (EF-SignSGD when wrapped in ErrorFeedback)."""

    name = "sign"
    payload_dtypes = 2

    def payload_bytes(self, shape):
        return math.ceil(numel(shape) / 8) + 4  # 8 signs a byte, a float32 scale per tensor

    def encode(self, x, where):
        return [pack_signs(x), x.abs().mean().reshape(1)]

    def decode(self, payload, like, where):
        return (unpack_signs(payload[0], like.numel()) * payload[1]).view_as(like).to(like.dtype)


class QSGD(Compressor):
    """Alistarh et al. 2017: ||x|| sign(x) xi/s, with xi stochastically rounded to s levels; unbiased."""

    def __init__(self, levels: int = 16):
        if not 1 <= levels <= 127:
            raise ValueError(f"QSGD levels must be in 1..127 (one signed byte per entry), got {levels}")
        self.levels, self.name = levels, f"qsgd s={levels}"

    payload_dtypes = 2

    def payload_bytes(self, shape):
        return numel(shape) + 4  # an int8 level per entry, a float32 norm

    def encode(self, x, where):
        norm = x.norm()
        if norm == 0:
            return [torch.zeros(x.numel(), dtype=torch.int8, device=x.device), norm.reshape(1)]
        scaled = x.reshape(-1).abs() / norm * self.levels
        lower = scaled.floor()
        draw = torch.rand(scaled.shape, generator=where.generator(shared=False, device=x.device), device=x.device)
        up = draw < (scaled - lower)
        level = (lower + up).to(torch.int8) * x.reshape(-1).sign().to(torch.int8)
        return [level, norm.reshape(1)]

    def decode(self, payload, like, where):
        return (payload[0].to(like.dtype) * payload[1] / self.levels).view_as(like)


class TernGrad(Compressor):
    """Wen et al. 2017: max|x| sign(x) b, b ~ Bernoulli(|x| / max|x|); one of {-1, 0, 1} per entry, unbiased."""

    name = "terngrad"
    payload_dtypes = 2

    def payload_bytes(self, shape):
        return numel(shape) + 4  # an int8 in {-1, 0, 1} per entry, a float32 scale

    def encode(self, x, where):
        flat = x.reshape(-1)
        scale = flat.abs().max()
        if scale == 0:
            return [torch.zeros(flat.numel(), dtype=torch.int8, device=x.device), scale.reshape(1)]
        draw = torch.rand(flat.shape, generator=where.generator(shared=False, device=x.device), device=x.device)
        keep = draw < flat.abs() / scale
        return [(flat.sign() * keep).to(torch.int8), scale.reshape(1)]

    def decode(self, payload, like, where):
        return (payload[0].to(like.dtype) * payload[1]).view_as(like)


class Int8PerChannel(Compressor):
    """Affine 8-bit codes with a float32 minimum and step per output channel (row); CPU-friendly,
    unlike PyTorch's quantization hooks, which hard-code CUDA."""

    name = "int8 per-channel"
    payload_dtypes = 2  # uint8 codes; the float32 minimums and steps share one gather

    def payload_bytes(self, shape):
        return numel(shape) + 8 * (shape[0] if len(shape) > 1 else 1)  # codes, a minimum and a step per row

    def encode(self, x, where):
        rows = x.reshape(x.shape[0] if x.dim() > 1 else 1, -1)
        low, high = rows.min(dim=1).values, rows.max(dim=1).values
        step = ((high - low) / 255).clamp_min(torch.finfo(x.dtype).tiny)
        codes = ((rows - low[:, None]) / step[:, None]).round().clamp(0, 255).to(torch.uint8)
        return [codes.reshape(-1), low, step]

    def decode(self, payload, like, where):
        codes, low, step = payload
        rows = codes.view(len(low), -1).to(like.dtype)
        return (rows * step[:, None] + low[:, None]).view_as(like)


class ErrorFeedback(Compressor):
    """Remember, per parameter, what the compressor did not send, and add it to the next gradient.

    residual_t = (x_t + residual_{t-1}) - decode(encode(x_t + residual_{t-1}))

    The residuals live in the ``memory`` the hook state hands to :meth:`compress` (one dict per
    run, keyed by parameter), never on this object: reusing it starts every run from zero.
    """

    def __init__(self, inner: Compressor):
        self.inner = inner
        self.name = f"{inner.name} + EF"
        self.summable = inner.summable

    @property
    def payload_dtypes(self) -> int:  # type: ignore[override]  # the inner compressor's, kept on no attribute
        return self.inner.payload_dtypes

    def payload_bytes(self, shape):
        return self.inner.payload_bytes(shape)  # the residual stays home

    def compress(self, x, where, memory):
        corrected = x + memory[where.key] if where.key in memory else x.clone()
        payload = self.inner.encode(corrected, where)
        memory[where.key] = corrected - self.inner.decode(payload, corrected, where)
        return payload

    def encode(self, x, where):
        raise TypeError(
            "ErrorFeedback keeps its residuals in the hook state: call compress(x, where, memory) with a "
            "dict that lives as long as the run (CompressorState.memory), or encode with the inner compressor"
        )

    def decode(self, payload, like, where):
        return self.inner.decode(payload, like, where)


# -- the adapter: any compressor as a DDP communication hook ---------------------------------------


@dataclass
class CompressorState:
    """A compressor's hook state: the compressor, the step count, and the run's memory.

    ``memory``: what error feedback remembers per parameter (as ``PowerSGDState.error_dict``),
    so a compressor object can be reused across runs without carrying one run into the next.
    """

    compressor: Compressor
    process_group: Any = None
    seed: int = 0
    step: int = 0
    keys: dict = field(default_factory=dict)
    memory: dict = field(default_factory=dict)
    pending: set = field(default_factory=set)  # compiled autograd: parameters seen in this backward

    def state_dict(self, parameters: list | None = None) -> dict:
        """The step count, the residuals and which parameter each key stands for, for a checkpoint.

        ``keys`` map ``id(param)``, which means nothing in another process; with ``parameters``
        (the model's, in order) they are saved as positions, so a resumed run (whose buckets may
        meet the parameters in another order) gives every residual back to its parameter.
        """
        saved = {"step": self.step, "memory": dict(self.memory)}
        if parameters is not None:
            position = {id(p): i for i, p in enumerate(parameters)}
            saved["keys"] = {position[pid]: key for pid, key in self.keys.items()}
        return saved

    def load_state_dict(self, saved: dict, parameters: list | None = None) -> None:
        self.step, self.memory = saved["step"], dict(saved["memory"])
        if "keys" in saved and parameters is not None:
            self.keys = {id(parameters[i]): key for i, key in saved["keys"].items()}
        elif self.memory:
            raise ValueError("these residuals were saved without their parameters: pass parameters= to both calls")


def make_state(compressor: Compressor):
    """A state factory for ExperimentConfig: ``factory(process_group) -> CompressorState``."""

    def factory(process_group=None, **options):
        return CompressorState(compressor, process_group, **options)

    factory.__name__ = f"state_for_{type(compressor).__name__}"
    return factory


def _by_dtype(tensors: list[torch.Tensor]) -> dict[torch.dtype, torch.Tensor]:
    groups: dict[torch.dtype, list[torch.Tensor]] = {}
    for t in tensors:
        groups.setdefault(t.dtype, []).append(t.reshape(-1))
    return {dtype: torch.cat(ts) for dtype, ts in groups.items()}


def _split_by_dtype(flat: dict[torch.dtype, torch.Tensor], like: list[torch.Tensor]) -> list[torch.Tensor]:
    offsets = {dtype: 0 for dtype in flat}
    out = []
    for t in like:
        start = offsets[t.dtype]
        out.append(flat[t.dtype][start : start + t.numel()].view(t.shape))
        offsets[t.dtype] = start + t.numel()
    return out


def compressor_hook(state: CompressorState, bucket):
    """Compress each gradient in the bucket, exchange the payloads, write the decoded mean back.

    One collective per payload dtype. Synchronous: the future it returns is already done. Under
    compiled autograd DDP passes one ``(grad, param)`` at a time and ignores the future: the mean
    is written into ``grad`` all the same, and a parameter seen twice marks the next step.
    """
    if isinstance(bucket, tuple):
        return _exchange_one(state, *bucket)  # DDP ignores it; a Future here would break the compiled graph
    _exchange(state, bucket.gradients(), bucket.parameters())
    if bucket.is_last():
        state.step += 1
    return completed_future(bucket.buffer())


# Traced by Dynamo, top-k and sign fail (torch 2.13: "AssertionError: sources must not be empty for symbol
# ..."), so under compiled autograd one parameter's exchange runs eagerly inside the compiled backward.
@_compat.disable_dynamo_lazily
def _exchange_one(state: CompressorState, grad: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    if id(param) in state.pending:  # no bucket.is_last() here: a repeat means a new backward
        state.step += 1
        state.pending.clear()
    state.pending.add(id(param))
    _exchange(state, [grad], [param])
    return grad


def average_compressed(state: CompressorState, tensors: list[torch.Tensor], owners: list[torch.Tensor]) -> None:
    """Replace each of ``tensors`` by the mean over ranks of what ``state.compressor`` sends for it, in place
    (``owners`` key the compressor's memory and seeds: the parameters the tensors belong to). One call per step:
    DiLoCo's compressed outer update uses it on the pseudo-gradients."""
    _exchange(state, tensors, owners)
    state.step += 1


def _exchange(state: CompressorState, grads: list[torch.Tensor], params: list[torch.Tensor]) -> None:
    group = state.process_group
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    compressor = state.compressor
    wheres = []
    for param in params:
        key = state.keys.setdefault(id(param), len(state.keys))
        wheres.append(Where(key, state.step, rank, state.seed))
    payloads = [compressor.compress(g, where, state.memory) for g, where in zip(grads, wheres)]
    flat_payload = [t for payload in payloads for t in payload]
    packed = _by_dtype(flat_payload)
    if compressor.summable:
        for tensor in packed.values():
            dist.all_reduce(tensor, group=group)
        summed = _split_by_dtype(packed, flat_payload)
        decoded = _decode_all(compressor, summed, payloads, grads, wheres)
        means = [d / world for d in decoded]
    else:
        gathered = {dtype: [torch.empty_like(t) for _ in range(world)] for dtype, t in packed.items()}
        for dtype, tensor in packed.items():
            dist.all_gather(gathered[dtype], tensor, group=group)
        means = [torch.zeros_like(g) for g in grads]
        for r in range(world):
            theirs = _split_by_dtype({dtype: copies[r] for dtype, copies in gathered.items()}, flat_payload)
            for mean, d in zip(means, _decode_all(compressor, theirs, payloads, grads, wheres)):
                mean += d
        means = [m / world for m in means]
    for g, mean in zip(grads, means):
        g.copy_(mean)


def _decode_all(compressor, flat_payload, payloads, grads, wheres):
    out, i = [], 0
    for payload, g, where in zip(payloads, grads, wheres):
        out.append(compressor.decode(flat_payload[i : i + len(payload)], g, where))
        i += len(payload)
    return out
