"""Hierarchical hooks: sum inside each node, all-reduce between nodes on one leg only, hand the sum back inside.

One step of :func:`hierarchical_hook`, per bucket (S bytes, W ranks on N nodes of L ranks each):

1. every rank divides its bucket by W (as PyTorch's allreduce and fp16 hooks do before they sum);
2. inside each node, ``reduce`` to the node's leader (its local rank 0): the node's sum, on the leader;
3. between nodes, the N leaders all-reduce that sum on the leg chosen: ``float32`` (exact), ``fp16`` (the
   16-bit cast, summed in 16 bits), ``power_sgd`` (PyTorch's ``powerSGD_hook`` with a ``PowerSGDState`` on the
   leaders' group) or ``topk`` (the lab's :class:`~.compressors.TopK`, with :class:`~.compressors.ErrorFeedback`
   by default, through :func:`~.compressors.compressor_hook`). The last two average over the leaders; the
   leader multiplies by N to keep the sum;
4. inside each node, the leader ``broadcast`` s the result.

Why node leaders, not the ranks of one local rank (NCCL's rings per NIC, HSDP's replicate all-reduce on 1/L of
the data each): those split the inter-node leg L ways because a real node has a NIC per GPU (rail-optimised
clusters), so the L legs run side by side. The lab's nodes have ONE uplink each, shared by their ranks
(:mod:`commhooks_lab.launcher.topology`): L legs of S/L bytes put the same 2(N-1)/N x S through it as one leg of
S. Through the leaders each tensor stays whole, so PowerSGD compresses each layer's matrix and top-k each
tensor, exactly as the flat hooks they are compared with do (on node sums rather than rank gradients).

The subgroups (one per node, and the leaders') are made once per default process group and node size
(``dist.new_subgroups_by_enumeration``, every rank in the same order) and kept for later builds; a step makes
none. The node size: the ``ranks_per_node`` state option, else ``LOCAL_WORLD_SIZE`` (torchrun sets it; so do the
lab's ranks: the ranks of a node with ``nodes=``, every rank without). With one node the hook is a reduce and a
broadcast: the flat mean. With one rank per node it is the flat all-reduce itself, bit for bit.

Synchronous: the future it returns is done (each collective waits). No ``from __future__ import annotations``:
DDP compares a hook's return annotation with ``torch.futures.Future[torch.Tensor]`` itself.
"""

import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from .contract import completed_future

__all__ = ["HierarchicalState", "hierarchical_hook", "LEGS", "make_state", "node_size"]

#: The inter-node legs: what crosses between nodes.
LEGS = ("float32", "fp16", "power_sgd", "topk")

#: (default process group, ranks per node) -> (that group, this rank's node group, the leaders' group, leader)
_SUBGROUPS: dict[tuple[int, int], tuple[Any, Any, Any, int]] = {}


def node_size(ranks_per_node: int, world: int) -> int:
    """Ranks per node: ``ranks_per_node`` if given (> 0), else ``LOCAL_WORLD_SIZE``; refused unless it divides
    ``world``, and refused when neither says (a world of one rank is one node)."""
    if ranks_per_node:
        size, source = ranks_per_node, f"ranks_per_node={ranks_per_node}"
    elif world == 1:
        return 1  # one rank is one node, wherever it runs
    else:
        given = os.environ.get("LOCAL_WORLD_SIZE")
        if given is None:
            raise ValueError(
                "a hierarchical hook needs the node size: run it on the lab's ranks (lab.run(..., nodes=2, "
                "link=...): each rank knows its node), under torchrun (LOCAL_WORLD_SIZE), or give the state option "
                "ranks_per_node="
            )
        size, source = int(given), f"LOCAL_WORLD_SIZE={given}"
    if size < 1 or world % size:
        raise ValueError(
            f"{source} does not divide the world of {world} ranks into nodes of equal size: a hierarchical hook "
            "needs whole nodes (give ranks_per_node= a divisor of the world size)"
        )
    return size


def _subgroups(ranks_per_node: int) -> tuple[Any, Any, int]:
    """This rank's node group, the leaders' group (None off the leaders) and its leader: made once per default
    group and node size. Every rank of the default group must call this, in the same order (``new_group``)."""
    default = dist.distributed_c10d._get_default_group()
    key = (id(default), ranks_per_node)
    kept = _SUBGROUPS.get(key)
    if kept is None or kept[0] is not default:  # a new default group may reuse a dead one's id
        world, rank = dist.get_world_size(), dist.get_rank()
        nodes = [list(range(start, start + ranks_per_node)) for start in range(0, world, ranks_per_node)]
        node_group = leaders = None
        if ranks_per_node > 1:
            node_group, _ = dist.new_subgroups_by_enumeration(nodes)
        if len(nodes) > 1:
            leaders, _ = dist.new_subgroups_by_enumeration([[ranks[0] for ranks in nodes]])
        kept = _SUBGROUPS[key] = (default, node_group, leaders, rank - rank % ranks_per_node)
    return kept[1], kept[2], kept[3]


@dataclass
class HierarchicalState:
    """What a step needs: the leg, the sizes, the subgroups (made once) and the leg's own state on the leaders."""

    leg: str
    world: int
    ranks_per_node: int
    node_group: Any  # None with one rank per node
    leaders: Any  # the leaders' group, on a leader with two nodes or more; None elsewhere
    leader: int  # the global rank of this rank's node leader
    inner: Any = None  # the leg's state on a leader: PowerSGDState, or CompressorState (top-k)

    @property
    def nodes(self) -> int:
        return self.world // self.ranks_per_node

    def state_dict(self) -> dict:
        """Top-k's residuals and step live on the leaders (PowerSGD's state pickles whole, as PyTorch's does)."""
        return self.inner.state_dict() if hasattr(self.inner, "state_dict") else {}

    def load_state_dict(self, saved: dict) -> None:
        if hasattr(self.inner, "load_state_dict"):
            self.inner.load_state_dict(saved)


def make_state(leg: str, options: dict, process_group: Any = None) -> HierarchicalState:
    """The state for ``leg`` with the leg's ``options`` (PowerSGD's, or top-k's ``ratio``, ``error_feedback``,
    ``seed``), on the default group: the subgroups are made here, once, not in a step."""
    if leg not in LEGS:
        raise ValueError(f"leg must be one of {LEGS}, got {leg!r}")
    if process_group is not None and process_group is not dist.group.WORLD:
        raise ValueError(
            "a hierarchical hook runs on the default process group: every rank makes the node subgroups, in order"
        )
    options = dict(options)
    world = dist.get_world_size()
    size = node_size(int(options.pop("ranks_per_node", 0)), world)
    node_group, leaders, leader = _subgroups(size)
    inner: Any = None
    if leaders is not None and leg == "power_sgd":
        from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState

        inner = PowerSGDState(process_group=leaders, **options)
    elif leaders is not None and leg == "topk":
        from .compressors import Compressor, CompressorState, ErrorFeedback, TopK

        compressor: Compressor = TopK(options.get("ratio", 0.01))
        if options.get("error_feedback", True):
            compressor = ErrorFeedback(compressor)
        inner = CompressorState(compressor, leaders, seed=options.get("seed", 0))
    return HierarchicalState(leg, world, size, node_group, leaders, leader, inner)


def _between_nodes(state: HierarchicalState, bucket, buffer: torch.Tensor) -> None:
    """The leaders' leg: ``buffer`` (this node's sum) becomes the sum over nodes, sent as ``state.leg`` says."""
    if state.leg == "float32":
        dist.all_reduce(buffer, group=state.leaders)
    elif state.leg == "fp16":
        wire = buffer.to(torch.float16)
        dist.all_reduce(wire, group=state.leaders)
        buffer.copy_(wire)
    else:
        if state.leg == "power_sgd":
            from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import powerSGD_hook

            out = powerSGD_hook(state.inner, bucket).wait()
        else:
            from .compressors import compressor_hook

            out = compressor_hook(state.inner, bucket).wait()  # writes into the bucket's gradient views
        if out.data_ptr() != buffer.data_ptr():
            buffer.copy_(out)
        buffer.mul_(state.nodes)  # both average over the leaders: back to the sum


def hierarchical_hook(state: HierarchicalState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Divide by W, sum inside the node on its leader, sum between the leaders (the leg), broadcast in the node."""
    buffer = bucket.buffer()
    buffer.div_(state.world)
    if state.node_group is not None:
        dist.reduce(buffer, dst=state.leader, group=state.node_group)
    if state.leaders is not None:
        _between_nodes(state, bucket, buffer)
    if state.node_group is not None:
        dist.broadcast(buffer, src=state.leader, group=state.node_group)
    return completed_future(buffer)
