"""When does compression pay off? Bytes by rule, an alpha-beta network model, and its assumptions.

On loopback compression never speeds a step up (loopback is fast, encoding is not); behind a real
rate-limited link it can, and :mod:`commhooks_lab.studies.links` measures that and holds this model against
it. This module counts bytes (measured on the lab's small models; computed by
the same rules, :func:`rule_traffic`, for real architectures whose shapes :func:`architectures`
builds without downloading anything) and *models* the network, with compression costs passed in
(notebook 8 measures them per element on this CPU).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import pandas as pd
import torch
from torch import nn

from ..hooks import registry
from ..hooks.traffic import Shape, allreduced, bucket_count, numel
from ..result import Result

__all__ = [
    "architectures",
    "ASSUMPTIONS",
    "break_even",
    "bucket_count",
    "bytes_table",
    "comm_seconds",
    "compression_cost_per_element",
    "every_h_traffic",
    "headroom",
    "link_bytes",
    "network_model",
    "parameter_count",
    "parameter_shapes",
    "payload",
    "rule_for",
    "rule_traffic",
    "traffic",
    "world_size_sweep",
]

ASSUMPTIONS = (
    "time a step spends on gradients = compression work + latency x ring steps + bytes over each rank's link / "
    "bandwidth (the alpha-beta model); forward, backward and optimizer time are the same for every hook and left out",
    "bytes = the payload each rank hands to collectives (measured on the lab's models, by rule for real ones); a ring "
    "all-reduce moves 2(W-1)/W of it over each link in 2(W-1) latency steps, a ring all-gather (W-1) times it in "
    "W-1 steps",
    "overlap: DDP starts each bucket's all-reduce during backward, so part of its time is hidden; the lab's "
    "compressing hooks wait for their collectives, so theirs is not. With overlap=0 the model hides nothing for "
    "anyone, which favours compression; overlap=f hides a fraction f of the communication of PyTorch's all-reduce "
    "and 16-bit hooks (ASYNCHRONOUS); PowerSGD, which chains its collectives and computes between them, is "
    "charged in full",
    "compression work = cost per element x elements, with the costs passed in (measured on this CPU in notebook 8: "
    "a GPU's are far lower; where the compression cost sets the break-even bandwidth it rises in proportion, "
    "where latency matters too (PowerSGD's three all-reduces per bucket) it rises less)",
)


def __getattr__(name: str) -> Any:
    """``ASYNCHRONOUS``: the hooks that start their collective and return at once, so DDP can overlap
    them with backward (``HookEntry.overlaps_backward``, read when asked: a hook you register counts)."""
    if name == "ASYNCHRONOUS":
        return tuple(e.name for e in registry.entries(registry.HOOK) if e.overlaps_backward)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# -- bytes by rule --------------------------------------------------------------------------------------


def rule_traffic(shapes: Sequence[Shape], hook: str, buckets: int | None = None, **options: Any) -> dict:
    """Bytes and collectives one rank hands over in a step where ``hook`` compresses (float32 gradients).

    ``hook`` is a registry name and ``options`` its state options; the rule is the hook's registry
    record's (``HookEntry.traffic``), and ``overlaps_backward`` says whether DDP can hide it behind
    backward. The tests check every rule against the bytes measured on the lab's models; error
    feedback changes no byte.
    """
    entry = registry.get(hook)
    if entry.traffic is None:
        ruled = [e.name for e in registry.entries(registry.HOOK, registry.COMPRESSOR) if e.traffic is not None]
        raise ValueError(f"no byte rule for hook {hook!r} (its registry record has none); rules: {ruled}")
    shapes = [tuple(s) for s in shapes]
    buckets = bucket_count(shapes) if buckets is None else buckets
    return {**entry.traffic(shapes, buckets, options), "overlaps_backward": entry.overlaps_backward}


def every_h_traffic(shapes: Sequence[Shape], every: int, bytes_per_element: int = 4) -> dict:
    """Per step, on average, for a method that all-reduces the whole model in one call every ``every`` steps
    (the lab's local SGD and DiLoCo; ``bytes_per_element=2`` for a 16-bit outer update): that all-reduce's bytes
    and its one call divided by ``every``. Nothing is hidden by overlap: the sync runs after the optimizer step."""
    t = allreduced(bytes_per_element * parameter_count(shapes), 1)
    return {**{k: v / every for k, v in t.items()}, "overlaps_backward": False}


def rule_for(result: Result) -> tuple[str, dict]:
    """The rule (hook name, options) a run's bytes should follow, from its config."""
    hook = result.config["hook"]
    if not isinstance(hook, str) or hook.startswith("compressor:") or ":" in hook:
        raise ValueError(f"{result.name}: give the hook by its registry name to compare it with a byte rule")
    return hook, dict(result.config.get("state_options") or {})


def parameter_shapes(model: nn.Module) -> list[Shape]:
    return [tuple(p.shape) for p in model.parameters() if p.requires_grad]


def parameter_count(shapes: Sequence[Shape]) -> int:
    return sum(numel(s) for s in shapes)


def payload(t: Mapping[str, float]) -> float:
    """Bytes one rank hands to collectives in a step: all-reduced plus all-gathered."""
    return t["allreduce_bytes"] + t["allgather_bytes"]


# -- real architectures, built on the meta device (shapes only: no memory, no download) -----------------


def _resnet(blocks: Sequence[int], bottleneck: bool, classes: int = 1000) -> nn.Module:
    """torchvision's ResNet layout (He et al. 2016): the same parameter shapes, in the same order."""
    layers: list[nn.Module] = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64)]
    inplanes, expansion = 64, 4 if bottleneck else 1
    for stage, (planes, count) in enumerate(zip((64, 128, 256, 512), blocks)):
        for block in range(count):
            stride, out = (2 if stage and not block else 1), planes * expansion
            if bottleneck:
                convs = [(inplanes, planes, 1, 1), (planes, planes, 3, stride), (planes, out, 1, 1)]
            else:
                convs = [(inplanes, planes, 3, stride), (planes, planes, 3, 1)]
            for c_in, c_out, k, s in convs:
                layers += [nn.Conv2d(c_in, c_out, k, s, k // 2, bias=False), nn.BatchNorm2d(c_out)]
            if stride != 1 or inplanes != out:
                layers += [nn.Conv2d(inplanes, out, 1, stride, bias=False), nn.BatchNorm2d(out)]
            inplanes = out
    layers.append(nn.Linear(inplanes, classes))
    return nn.ModuleList(layers)


def _embedding(rows: int, width: int) -> nn.Embedding:
    """An embedding with an uninitialised weight: shapes are all the model needs (normal_ on meta is slow)."""
    return nn.Embedding(rows, width, _weight=torch.empty(rows, width))


def _transformer(vocab: int, positions: int, types: int, width: int, depth: int, qkv_packed: bool,
                 pooler: bool) -> nn.Module:  # fmt: skip
    """BERT's and GPT-2's parameter shapes: embeddings, depth x (attention, MLP, two LayerNorms)."""
    layers: list[nn.Module] = [_embedding(vocab, width), _embedding(positions, width)]
    if types:
        layers += [_embedding(types, width), nn.LayerNorm(width)]
    for _ in range(depth):
        attention = [nn.Linear(width, 3 * width)] if qkv_packed else [nn.Linear(width, width) for _ in range(3)]
        layers += [*attention, nn.Linear(width, width), nn.LayerNorm(width)]
        layers += [nn.Linear(width, 4 * width), nn.Linear(4 * width, width), nn.LayerNorm(width)]
    layers.append(nn.Linear(width, width) if pooler else nn.LayerNorm(width))
    return nn.ModuleList(layers)


#: name -> (builder, what it stands for)
ARCHITECTURES: dict[str, tuple[Callable[[], nn.Module], str]] = {
    "ResNet-18": (lambda: _resnet((2, 2, 2, 2), False), "torchvision resnet18, 1000 classes"),
    "ResNet-50": (lambda: _resnet((3, 4, 6, 3), True), "torchvision resnet50, 1000 classes"),
    "BERT-base": (
        lambda: _transformer(30522, 512, 2, 768, 12, qkv_packed=False, pooler=True),
        "BERT-base uncased encoder with pooler (Devlin et al. 2019)",
    ),
    "GPT-2 small": (
        lambda: _transformer(50257, 1024, 0, 768, 12, qkv_packed=True, pooler=False),
        "GPT-2 124M, output layer tied to the token embedding (Radford et al. 2019); nn.Linear's (out, in) "
        "layout where GPT-2 uses (in, out), which changes no byte count except int8's per-row scales",
    ),
}


def architectures(include_lab_models: bool = True) -> dict[str, list[Shape]]:
    """Parameter shapes of real models, built with torch.nn on the meta device; the lab's models first."""
    out: dict[str, list[Shape]] = {}
    if include_lab_models:
        from ..engine.models import build_task

        for name in ("mlp", "cnn"):
            out[f"digits {name.upper()} (this lab)"] = parameter_shapes(build_task(name, 0).model)
    with torch.device("meta"):
        for name, (build, _) in ARCHITECTURES.items():
            out[name] = parameter_shapes(build())
    return out


def bytes_table(
    models: Mapping[str, Sequence[Shape]], hooks: Mapping[str, tuple[str, dict]], world_size: int = 8
) -> pd.DataFrame:
    """For every model and hook: payload and bytes over each rank's link per step, by rule.

    ``hooks``: a label -> (registry name, state options), e.g. ``{"power_sgd r4": ("power_sgd",
    {"matrix_approximation_rank": 4})}``. Ratios compare with the fp32 all-reduce of the same model.
    """
    rows = []
    for model, shapes in models.items():
        fp32 = link_bytes(rule_traffic(shapes, "allreduce"), world_size)
        for label, (hook, options) in hooks.items():
            t = rule_traffic(shapes, hook, **options)
            rows.append(
                {
                    "model": model,
                    "parameters": sum(numel(s) for s in shapes),
                    "hook": label,
                    "payload_bytes": t["allreduce_bytes"] + t["allgather_bytes"],
                    "link_bytes": link_bytes(t, world_size),
                    "link_vs_fp32": link_bytes(t, world_size) / fp32,
                }
            )
    return pd.DataFrame(rows)


def world_size_sweep(
    shapes: Sequence[Shape], hooks: Mapping[str, tuple[str, dict]], world_sizes: Sequence[int]
) -> pd.DataFrame:
    """Bytes over each rank's link per step against world size: all-gathered payloads grow with W."""
    rows = []
    for label, (hook, options) in hooks.items():
        t = rule_traffic(shapes, hook, **options)
        rows += [{"hook": label, "world_size": w, "link_bytes": link_bytes(t, w)} for w in world_sizes]
    return pd.DataFrame(rows)


# -- the alpha-beta model -----------------------------------------------------------------------------------


def traffic(result: Result) -> dict:
    """Mean per-step bytes and calls, measured, over the steps where the hook compressed; whether it
    overlaps backward comes from its registry record (a hook the registry does not name: it does not)."""
    s = result.compressed_steps()
    gather_bytes = s["allgather_bytes"].mean()
    gather_calls = s["allgather_calls"].mean()
    hook = result.config.get("hook")
    names = registry.hook_names()
    return {
        "allreduce_bytes": s["payload_bytes"].mean() - gather_bytes,
        "allgather_bytes": gather_bytes,
        "allreduce_calls": s["collective_calls"].mean() - gather_calls,
        "allgather_calls": gather_calls,
        "overlaps_backward": hook in names and registry.get(hook).overlaps_backward,
    }


def link_bytes(t: Mapping[str, float], world_size: int) -> float:
    """Bytes over each rank's link with ring algorithms: 2(W-1)/W x all-reduced, (W-1) x all-gathered."""
    w = world_size
    return 2 * (w - 1) / w * t["allreduce_bytes"] + (w - 1) * t["allgather_bytes"]


def _ring_steps(t: Mapping[str, float], world_size: int) -> float:
    """Sequential latency hops: 2(W-1) per ring all-reduce, W-1 per ring all-gather."""
    w = world_size
    return 2 * (w - 1) * t["allreduce_calls"] + (w - 1) * t["allgather_calls"]


def comm_seconds(t: Mapping[str, float], world_size: int, bandwidth_gbps: float, latency_us: float) -> float:
    return _ring_steps(t, world_size) * latency_us * 1e-6 + link_bytes(t, world_size) * 8 / (bandwidth_gbps * 1e9)


def _hidden(t: Mapping[str, float], overlap: float) -> float:
    """The share of a hook's communication that backward hides: ``overlap`` if it overlaps at all."""
    return overlap if t.get("overlaps_backward") else 0.0


def network_model(
    traffics: Mapping[str, Mapping[str, float]],
    compress_s: Mapping[str, float] | None = None,
    bandwidths_gbps: Sequence[float] = (1, 10, 100),
    world_sizes: Sequence[int] = (2, 8, 64),
    latency_us: float = 5.0,
    overlap: float = 0.0,
    baseline: str = "allreduce",
) -> pd.DataFrame:
    """Modelled gradient time per step for every hook, bandwidth and world size (see ``ASSUMPTIONS``).

    ``traffics``: hook name -> :func:`traffic` or :func:`rule_traffic`; ``compress_s``: hook name ->
    seconds of compression work per step (0 if missing).
    """
    if baseline not in traffics:
        raise ValueError(f"the network model compares with {baseline!r}: include it among the traffics")
    compress_s = compress_s or {}
    rows = []
    for name, t in traffics.items():
        for w in world_sizes:
            for bw in bandwidths_gbps:
                comm = comm_seconds(t, w, bw, latency_us) * (1.0 - _hidden(t, overlap))
                work = compress_s.get(name, 0.0)
                rows.append(
                    {
                        "hook": name,
                        "world_size": w,
                        "bandwidth_gbps": bw,
                        "overlap": _hidden(t, overlap),
                        "compress_ms": work * 1e3,
                        "comm_ms": comm * 1e3,
                        "step_ms": (work + comm) * 1e3,
                    }
                )
    table = pd.DataFrame(rows)
    base = table[table["hook"] == baseline].set_index(["world_size", "bandwidth_gbps"])["step_ms"]
    table[f"speedup_vs_{baseline}"] = [
        base[(w, bw)] / ms for w, bw, ms in zip(table["world_size"], table["bandwidth_gbps"], table["step_ms"])
    ]
    return table


def break_even(
    traffics: Mapping[str, Mapping[str, float]],
    compress_s: Mapping[str, float] | None = None,
    world_size: int = 8,
    latency_us: float = 5.0,
    overlap: float = 0.0,
    baseline: str = "allreduce",
) -> pd.DataFrame:
    """The bandwidth below which each hook's gradient time beats the baseline's: where they are equal.

    o_h + e_h (a n_h + b_h / bw) = o_0 + e_0 (a n_0 + b_0 / bw)
    =>  bw = (e_0 b_0 - e_h b_h) / (o_h - o_0 + a (e_h n_h - e_0 n_0))
    with o the compression work, e the exposed share (overlap), a the latency, n ring steps and b bits over a link.
    """
    compress_s = compress_s or {}
    ref = traffics[baseline]
    e0, o0 = 1.0 - _hidden(ref, overlap), compress_s.get(baseline, 0.0)
    a = latency_us * 1e-6
    rows = []
    for name, t in traffics.items():
        if name == baseline:
            continue
        eh, oh = 1.0 - _hidden(t, overlap), compress_s.get(name, 0.0)
        bits_saved = 8 * (e0 * link_bytes(ref, world_size) - eh * link_bytes(t, world_size))
        cost = oh - o0 + a * (eh * _ring_steps(t, world_size) - e0 * _ring_steps(ref, world_size))
        if bits_saved <= 0:
            verdict, gbps = "never (as many unhidden bytes or more)", math.nan
        elif cost <= 0:
            verdict, gbps = "always", math.inf
        else:
            gbps = bits_saved / cost / 1e9
            verdict = f"below {gbps:.3g} Gbit/s"
        rows.append(
            {
                "hook": name,
                "world_size": world_size,
                "link_bytes_vs_baseline": link_bytes(t, world_size) / link_bytes(ref, world_size),
                "compress_ms": oh * 1e3,
                "break_even_gbps": gbps,
                "pays_off": verdict,
            }
        )
    return pd.DataFrame(rows)


# -- the cost of compressing, per element, on this machine ---------------------------------------------------


def _seconds(fn: Callable[[], Any], repeats: int) -> float:
    """Best of ``repeats`` (after a warm-up call): on a shared machine the fastest run is the least disturbed."""
    fn()  # warm-up: allocations, first-call dispatch
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def compression_cost_per_element(
    side: int = 1024,
    matrix_ranks: Sequence[int] = (1, 4),
    ratio: float = 0.01,
    repeats: int = 7,
    threads: int = 1,
) -> dict[str, float]:
    """Seconds per gradient element of each hook's local work, timed here on a ``side`` x ``side`` matrix.

    Keys are the run names of notebook 8's hooks (``fp16``, ``power_sgd r1``, ``topk 1% + EF``, ...).

    What is timed is the arithmetic each hook does around its collectives (see the hooks' source):
    fp16: cast, divide, cast back; PowerSGD matrix rank r: P = MQ, orthogonalise P, Q = M^T P, M = P Q^T
    (batched matrix products, as powerSGD_hook), plus error feedback's add, copy and subtract; top-k: |x|,
    topk, scatter into zeros, residual; sign: mean |x|, pack and unpack the signs, residual. One thread by
    default, like the lab's ranks.
    """
    from ..hooks.compressors import pack_signs, unpack_signs

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        gen = torch.Generator().manual_seed(0)
        m = torch.randn(side, side, generator=gen)
        flat = m.reshape(-1)
        n = flat.numel()
        k = max(1, int(ratio * n))

        def fp16() -> None:
            m.to(torch.float16).div_(2).to(torch.float32)

        def power_sgd(r: int) -> Callable[[], None]:
            batch = m.unsqueeze(0)  # powerSGD_hook works on batches of matrices, (1, rows, cols) here
            p, q = torch.empty(1, side, r), torch.randn(1, side, r, generator=gen)
            error = torch.zeros_like(batch)

            def orthogonalize(x: torch.Tensor) -> None:  # as powerSGD_hook: Gram-Schmidt for r <= 2, else QR
                if r > 2:
                    torch.linalg.qr(x, out=(x, torch.empty(1, r, r)))
                    return
                for i in range(r):
                    col = x[:, :, i : i + 1]
                    col /= torch.norm(col, dim=1, keepdim=True)
                    if i + 1 < r:
                        rest = x[:, :, i + 1 :]
                        rest -= torch.sum(col * rest, dim=1, keepdim=True) * col

            def work() -> None:
                corrected = batch + error  # error feedback in
                copy = corrected.clone()
                torch.bmm(corrected, q, out=p)
                orthogonalize(p)
                torch.bmm(corrected.transpose(1, 2), p, out=q)
                torch.bmm(p, q.transpose(1, 2), out=corrected)
                _ = copy - corrected  # error feedback out

            return work

        def topk() -> None:
            indices = flat.abs().topk(k, sorted=False).indices
            sent = torch.zeros_like(flat)
            sent[indices] = flat[indices]
            _ = flat - sent

        def sign() -> None:
            scale = flat.abs().mean()
            decoded = unpack_signs(pack_signs(flat), n) * scale
            _ = flat - decoded

        jobs: dict[str, Callable[[], None]] = {"fp16": fp16}
        jobs.update({f"power_sgd r{r}": power_sgd(r) for r in matrix_ranks})
        jobs.update({f"topk {ratio:.0%} + EF": topk, "sign + EF": sign})
        return {name: _seconds(job, repeats) / n for name, job in jobs.items()}
    finally:
        torch.set_num_threads(previous)


def headroom(results: Iterable[Result], reference: str = "no", skip: int = 5) -> pd.DataFrame:
    """Median step time of each run (first ``skip`` steps left out: warm-up), and its change vs ``reference``."""
    runs = {r.name: r for r in results}
    if reference not in runs:
        raise ValueError(f"headroom needs a run named {reference!r} to compare with")
    median_ms = {name: 1e3 * r.steps["step_time_s"].iloc[skip:].median() for name, r in runs.items()}
    table = pd.DataFrame({"median_step_ms": median_ms})
    table[f"vs_{reference}"] = table["median_step_ms"] / median_ms[reference] - 1
    return table
