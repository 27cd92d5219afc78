"""FSDP2's own communication hooks used for real: a custom reduce-scatter and HSDP's replica all-reduce hook.

FSDP2 has no ``GradBucket`` and no futures. Its two places to change gradient communication
(torch 2.13 and 2.14 alike, ``torch/distributed/fsdp/_fully_shard/``) are:

- ``FSDPModule.set_custom_reduce_scatter(comm)``: ``comm`` is a ``ReduceScatter`` (``_fsdp_api.py``),
  an object with ``allocate(size, *, dtype, device)`` (FSDP allocates the reduce-scatter's input and
  output buffers through it, in ``reduce_dtype``) and ``__call__(output_tensor, input_tensor, group, op,
  async_op=False)``. ``foreach_reduce`` (``_fsdp_collectives.py``) calls it once per FSDP module per
  backward, synchronously, with the module's flat gradient already pre-divided and laid out as W equal
  rank chunks; it must fill ``output_tensor`` (this rank's chunk, reduced with ``op``), and its return is
  ignored.
- ``FSDPModule.set_all_reduce_hook(hook)``: ``hook(reduce_output) -> None`` edits this rank's shard of the
  reduced gradient in place, before FSDP's post-divide. On a 1-D mesh it runs on the reduce-scatter's
  output; on a 2-D (native HSDP) mesh it runs *after* FSDP's own replica all-reduce, so it cannot
  replace it. Compressing HSDP's replica leg therefore means ``fully_shard`` on the shard dimension of a
  2-D mesh (FSDP inside a node) and a hook that all-reduces across the replicate dimension itself.

:class:`Wire16ReduceScatter` sends 16-bit values and sums them in float32 (optionally with error feedback,
one memory per module); :class:`Wire16ReplicaAllReduce`
averages across replicas the same way. With ``dtype=torch.float32`` each does the default path's arithmetic
(bit for bit at two addends), which is how a test holds their plumbing to PyTorch's own path.
:func:`fsdp2_comms_job` trains a lab task with one of :data:`SETUPS` and measures each step against the
float64 mean of the ranks' unsharded gradients, with the bytes of every collective.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from .._compat import fsdp2_reduce_scatter_base

__all__ = [
    "SETUPS",
    "Wire16ReduceScatter",
    "Wire16ReplicaAllReduce",
    "fsdp2_comms_job",
    "module_shapes",
    "reduce_",
    "shard_with",
]


def reduce_(total: torch.Tensor, op: Any, world: int) -> torch.Tensor:
    """Apply FSDP's ``op`` to a float32 sum: ``AVG`` divides by W (as gloo's AVG does), ``SUM`` leaves it.

    ``PREMUL_SUM`` (``set_gradient_divide_factor`` with a factor other than W) hides its factor in a C++
    object Python cannot read, so it is refused rather than guessed.
    """
    if op == dist.ReduceOp.AVG:
        return total.div_(world)
    if op == dist.ReduceOp.SUM:
        return total
    raise ValueError(f"a custom reduce-scatter here reduces with SUM or AVG only, got {op!r}")


def _sum32(wire: torch.Tensor, group: Any) -> torch.Tensor:
    """Every rank's chunk r of ``wire`` (W equal chunks), summed in float32 on rank r (an all-to-all)."""
    world = dist.get_world_size(group)
    received = torch.empty_like(wire)
    dist.all_to_all_single(received, wire, group=group)  # rank r gets chunk r from every rank
    return received.view(world, -1).to(torch.float32).sum(dim=0)


class Wire16ReduceScatter(fsdp2_reduce_scatter_base()):  # type: ignore[misc]
    """A reduce-scatter that sends ``dtype`` values and adds them in float32.

    Each rank casts its input once (the only rounding with a float32 reduce_dtype), sends rank r its
    chunk r (all-to-all: (W-1)/W of the input, in ``dtype``), and sums the W chunks it receives in
    float32. The busiest link carries a 16-bit ring reduce-scatter's bytes; no sum is rounded.

    With ``error_feedback`` the cast's rounding error is kept and added to the next call's input, so
    the roundings cancel over steps. FSDP calls a comm once per module and has no bucket index, so
    the memory belongs to one module: give each ``fully_shard``ed module its own comm.
    """

    def __init__(self, dtype: torch.dtype = torch.float16, error_feedback: bool = False) -> None:
        if dtype not in (torch.float16, torch.bfloat16, torch.float32):
            raise ValueError(f"dtype must be torch.float16, torch.bfloat16 or torch.float32, got {dtype}")
        self.dtype, self.error_feedback = dtype, error_feedback
        self.residual: torch.Tensor | None = None

    def allocate(self, size: Sequence[int | torch.SymInt], *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """FSDP's buffers, as its DefaultAllocMixin makes them: the 16-bit copy is made in ``__call__``."""
        return torch.empty(*size, dtype=dtype, device=device)

    def _wire(self, values: torch.Tensor) -> torch.Tensor:
        """What is sent: the values in ``dtype``, after adding the last call's rounding error (error feedback)."""
        if not self.error_feedback:
            return values.to(self.dtype)
        if self.residual is not None:
            if self.residual.shape != values.shape:
                raise ValueError(
                    f"this comm's error feedback holds a gradient of {self.residual.numel()} values and was handed "
                    f"{values.numel()}: give each fully_shard-ed module its own Wire16ReduceScatter"
                )
            values = values + self.residual
        wire = values.to(self.dtype)
        self.residual = values - wire.to(values.dtype)
        return wire

    def __call__(
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        group: dist.ProcessGroup,
        op: Any,
        async_op: bool = False,
    ) -> dist.Work | None:
        if async_op:  # FSDP 2.13/2.14 never asks; a Work to wait on would need a C++ object
            raise ValueError("Wire16ReduceScatter runs synchronously (FSDP2 calls it with async_op=False)")
        total = _sum32(self._wire(input_tensor), group)
        output_tensor.copy_(reduce_(total, op, dist.get_world_size(group)))
        return None


class Wire16ReplicaAllReduce:
    """``set_all_reduce_hook``'s hook: the mean over ``group`` (HSDP's replicas), 16-bit wire, float32 sums.

    All-to-all of the ``dtype`` shard, a float32 sum of each chunk on its rank, division by the group's
    size, one rounding to ``dtype`` and an all-gather: a 16-bit ring all-reduce's bytes. With float32 it is
    an all-reduce in float32 (sum, then divide), as FSDP's native replica all-reduce computes it.
    """

    def __init__(self, group: dist.ProcessGroup, dtype: torch.dtype = torch.float16) -> None:
        if dtype not in (torch.float16, torch.bfloat16, torch.float32):
            raise ValueError(f"dtype must be torch.float16, torch.bfloat16 or torch.float32, got {dtype}")
        self.group, self.dtype = group, dtype

    def __call__(self, reduce_output: torch.Tensor) -> None:
        world = dist.get_world_size(self.group)
        flat = reduce_output.view(-1)
        piece = -(-flat.numel() // world)  # ceil: gloo's all-gather takes equal pieces
        wire = torch.zeros(world * piece, dtype=self.dtype, device=flat.device)
        wire[: flat.numel()] = flat  # the one rounding of each rank's value
        mean = _sum32(wire, self.group).div_(world).to(self.dtype)  # the mean's one rounding
        gathered = torch.empty_like(wire)
        dist.all_gather(list(gathered.view(world, piece).unbind()), mean, group=self.group)
        flat.copy_(gathered[: flat.numel()])


def _modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules the lab shards, leaves first: every Linear and Conv2d, then the root (once, if it is one)."""
    leaves = [m for m in model.modules() if isinstance(m, torch.nn.Linear | torch.nn.Conv2d) and m is not model]
    return [*leaves, model]


def module_shapes(model: torch.nn.Module) -> list[tuple[list[tuple[int, ...]], bool]]:
    """Each module the lab shards: its own parameters' shapes (not those of a sharded module inside it), and
    whether it re-gathers them in backward (all but the root): the byte rule's input
    (:func:`commhooks_lab.engine.fsdp2_comm_spec.fsdp2_traffic`)."""
    modules = _modules(model)
    owner: dict[int, torch.nn.Module] = {}
    for module in modules:  # leaves first: a parameter belongs to the first sharded module that holds it
        for p in module.parameters():
            owner.setdefault(id(p), module)
    return [
        ([tuple(p.shape) for p in module.parameters() if owner[id(p)] is module], module is not model)
        for module in modules
    ]


def shard_with(model: torch.nn.Module, spec: str, reduce_dtype: torch.dtype, world: int, nodes: int) -> None:
    """``fully_shard`` ``model`` for ``lab.run(api='fsdp2', fsdp2_comm=spec)`` (checked already,
    :mod:`commhooks_lab.engine.fsdp2_comm_spec`): one ``Wire16ReduceScatter`` per module (each its own error
    feedback memory), native HSDP, or FSDP on each node's ranks with the replica hook."""
    from torch.distributed.device_mesh import init_device_mesh

    from .fsdp2_comm_spec import parse_fsdp2_comm

    name, options = parse_fsdp2_comm(spec)
    policy = MixedPrecisionPolicy(reduce_dtype=reduce_dtype)
    if name == "wire16_reduce_scatter":
        dtype, feedback = getattr(torch, options["dtype"]), options["error_feedback"]

        def own_comm(m: Any) -> None:
            m.set_custom_reduce_scatter(Wire16ReduceScatter(dtype, error_feedback=feedback))

        _shard(model, init_device_mesh("cpu", (world,)), policy, own_comm)
    elif name == "hsdp":
        _shard(model, _hsdp_mesh(world, nodes), policy, lambda m: None)
    elif name == "hsdp_wire16":
        mesh = _hsdp_mesh(world, nodes)
        hook = Wire16ReplicaAllReduce(mesh["replicate"].get_group(), getattr(torch, options["dtype"]))
        _shard(model, mesh["shard"], policy, lambda m: m.set_all_reduce_hook(hook))
    else:
        raise ValueError(f"no fsdp2_comm {spec!r}")


def _shard(model: torch.nn.Module, mesh: Any, policy: MixedPrecisionPolicy, configure: Callable) -> None:
    """``fully_shard`` each module on ``mesh``, then ``configure`` each (a hook is per FSDP module)."""
    for module in _modules(model):
        fully_shard(module, mesh=mesh, mp_policy=policy)
    for module in _modules(model):
        configure(module)


def _hsdp_mesh(world: int, nodes: int) -> Any:
    """A 2-D mesh: ``nodes`` replicas across, world/nodes shards inside each."""
    from torch.distributed.device_mesh import init_device_mesh

    if nodes < 2 or world % nodes or world // nodes < 2:
        raise ValueError(f"HSDP here takes 2+ nodes of 2+ ranks each, got {world} ranks on {nodes} nodes")
    return init_device_mesh("cpu", (nodes, world // nodes), mesh_dim_names=("replicate", "shard"))


def _build(name: str, model: torch.nn.Module, world: int, nodes: int) -> None:
    """Shard ``model`` as the setup ``name`` says (:data:`SETUPS`)."""
    from torch.distributed.device_mesh import init_device_mesh

    plain = MixedPrecisionPolicy()

    def none(module: Any) -> None:
        pass

    if name == "default":
        _shard(model, init_device_mesh("cpu", (world,)), plain, none)
    elif name == "reduce_dtype_fp16":
        _shard(model, init_device_mesh("cpu", (world,)), MixedPrecisionPolicy(reduce_dtype=torch.float16), none)
    elif name == "rs_fp32_force_sum":  # FSDP hands the comm SUM and divides afterwards
        comm = Wire16ReduceScatter(torch.float32)

        def force_sum(m: Any) -> None:
            m.set_custom_reduce_scatter(comm)
            m.set_force_sum_reduction_for_comms(True)

        _shard(model, init_device_mesh("cpu", (world,)), plain, force_sum)
    elif name == "rs_fp16_reduce_dtype_fp16":  # float16 buffers: SUM, pre- and post-divided by FSDP
        comm = Wire16ReduceScatter(torch.float16)
        policy = MixedPrecisionPolicy(reduce_dtype=torch.float16)
        _shard(model, init_device_mesh("cpu", (world,)), policy, lambda m: m.set_custom_reduce_scatter(comm))
    elif name.endswith("_ef"):  # error feedback: one comm, and so one memory, per module
        dtype = _DTYPES[name.removeprefix("rs_").removesuffix("_ef")]

        def own_comm(m: Any) -> None:
            m.set_custom_reduce_scatter(Wire16ReduceScatter(dtype, error_feedback=True))

        _shard(model, init_device_mesh("cpu", (world,)), plain, own_comm)
    elif name.startswith("rs_"):
        comm = Wire16ReduceScatter(_DTYPES[name.removeprefix("rs_")])
        _shard(model, init_device_mesh("cpu", (world,)), plain, lambda m: m.set_custom_reduce_scatter(comm))
    elif name == "hsdp":
        _shard(model, _hsdp_mesh(world, nodes), plain, none)
    elif name.startswith("hsdp_hook_"):
        mesh = _hsdp_mesh(world, nodes)
        hook = Wire16ReplicaAllReduce(mesh["replicate"].get_group(), _DTYPES[name.removeprefix("hsdp_hook_")])
        _shard(model, mesh["shard"], plain, lambda m: m.set_all_reduce_hook(hook))
    elif name == "hsdp_native_with_hook":
        mesh = _hsdp_mesh(world, nodes)
        hook = Wire16ReplicaAllReduce(mesh["replicate"].get_group(), torch.float16)
        _shard(model, mesh, plain, lambda m: m.set_all_reduce_hook(hook))
    else:
        raise ValueError(f"setup must be one of {', '.join(SETUPS)}, got {name!r}")


_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}

#: What each setup does to the gradients' reduction (the job's ``setup`` argument).
SETUPS = {
    "default": "fully_shard on a 1-D mesh, float32 reduce-scatter (PyTorch's own path)",
    "reduce_dtype_fp16": "MixedPrecisionPolicy(reduce_dtype=float16): FSDP2's own 16-bit path, sums in float16",
    "rs_fp32": "set_custom_reduce_scatter(Wire16ReduceScatter(float32)): the default's arithmetic, by all-to-all",
    "rs_fp16": "set_custom_reduce_scatter(Wire16ReduceScatter(float16)): float16 on the wire, float32 sums",
    "rs_bf16": "set_custom_reduce_scatter(Wire16ReduceScatter(bfloat16)): bfloat16 on the wire, float32 sums",
    "rs_fp16_ef": "Wire16ReduceScatter(float16, error_feedback=True), one per module: the roundings cancel over steps",
    "rs_bf16_ef": "Wire16ReduceScatter(bfloat16, error_feedback=True), one per module",
    "rs_fp32_force_sum": "rs_fp32 with set_force_sum_reduction_for_comms(True): op=SUM, FSDP divides afterwards",
    "rs_fp16_reduce_dtype_fp16": "Wire16ReduceScatter(float16) under reduce_dtype=float16: SUM, the sum rounded once",
    "hsdp": "fully_shard on a 2-D mesh (replicate x shard): FSDP2's native HSDP, float32 replica all-reduce",
    "hsdp_hook_fp32": "fully_shard on the shard dimension, set_all_reduce_hook averaging replicas in float32",
    "hsdp_hook_fp16": "fully_shard on the shard dimension, set_all_reduce_hook: float16 wire, float32 sums",
    "hsdp_hook_bf16": "fully_shard on the shard dimension, set_all_reduce_hook: bfloat16 wire, float32 sums",
    "hsdp_native_with_hook": "native HSDP plus a float16 hook: the hook runs after FSDP's float32 all-reduce",
}


def _full(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's whole value, flat (an all-gather over its mesh), or the tensor itself."""
    return (tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor).reshape(-1)


def _grad(p: torch.Tensor) -> torch.Tensor:
    """``p.grad``: every parameter of the lab's tasks gets one in each backward."""
    if p.grad is None:
        raise RuntimeError("a parameter got no gradient in backward")
    return p.grad


def fsdp2_comms_job(
    ctx, setup: str, steps: int = 3, seed: int = 0, model: str = "mlp", batch_size: int = 32, nodes: int = 2
) -> dict:
    """Worker: ``steps`` SGD steps of ``model`` under ``setup``; each step's full gradient and its measurement.

    The HSDP setups put the ranks on ``nodes`` replicas of world/nodes shards.

    The reference is the float64 mean of every rank's own unsharded gradient, computed on an unsharded
    copy holding the step's parameters (as :func:`commhooks_lab.engine.fsdp2.fsdp2_job` measures).
    Bytes are counted only while backward runs: the reduce-scatters, the hooks' collectives and the
    parameters' re-gathers. ``wire_bytes`` is what this process wrote meanwhile (``/proc/self/io``);
    ``cumulative_rel_error`` compares the sums over the steps so far (what error feedback keeps close).
    """
    from ..measure.metrics import errors_from_sums
    from ..measure.payload import PayloadCounter, written_bytes
    from .data import rank_batches
    from .models import build_task

    task = build_task(model, seed)
    local = copy.deepcopy(task.model)
    net = task.model
    _build(setup, net, ctx.world_size, nodes)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.05)
    batches = rank_batches(task.train, ctx.rank, ctx.world_size, batch_size, seed)
    loss_fn = task.loss_fn()
    counter = PayloadCounter.install()
    rows, grads = [], []
    sent_sum, exact_sum = None, None  # the sums over steps: what error feedback keeps close
    for step in range(steps):
        ctx.heartbeat(step)
        x, y = next(batches)
        with torch.no_grad():
            for p_local, p in zip(local.parameters(), net.parameters()):
                p_local.copy_(_full(p).view_as(p_local))
        local.zero_grad(set_to_none=True)
        loss_fn(local(x), y).backward()
        exact = torch.cat([_grad(p).reshape(-1) for p in local.parameters()]).double()
        dist.all_reduce(exact)
        exact /= ctx.world_size
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(net(x), y)
        counter.reset()
        wrote = written_bytes()
        start = time.perf_counter()
        counter.active = True
        loss.backward()
        counter.active = False
        elapsed = time.perf_counter() - start
        wrote_after = written_bytes()
        by_op = dict(counter.bytes_by_op)
        ring = counter.ring_bytes
        h = torch.cat([_full(_grad(p)) for p in net.parameters()])
        optimizer.step()
        diff = h.double() - exact
        sent_sum = h.double() if sent_sum is None else sent_sum + h.double()
        exact_sum = exact.clone() if exact_sum is None else exact_sum + exact
        drift = sent_sum - exact_sum
        rows.append(
            {
                "step": step,
                "setup": setup,
                **errors_from_sums(
                    float(diff @ diff), float(exact @ exact), float(h.double() @ h.double()), float(diff.abs().max())
                ),
                "cumulative_rel_error": float(drift.norm() / exact_sum.norm()),
                "ring_bytes": ring,
                "wire_bytes": None if wrote is None or wrote_after is None else wrote_after - wrote,
                "backward_s": elapsed,
                **{f"{op}_bytes": n for op, n in by_op.items()},
            }
        )
        grads.append(h.clone())
    return {"rank": ctx.rank, "rows": rows, "grads": grads}
