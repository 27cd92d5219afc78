"""Counting the bytes a rank hands to ``torch.distributed``, collective by collective, and reading
the bytes it really wrote.

Two independent numbers per step, so each checks the other:

- ``payload_bytes`` (and ``ring_bytes``): counted from the tensors handed to every collective
  that moves tensor data (``PayloadCounter`` patches ``torch.distributed`` once per process);
- ``wire_bytes``: what the process really wrote, from the kernel (``/proc/self/io`` ``wchar``,
  Linux only): sockets, plus anything printed while the step ran.

Counting rules (W = the size of the ``group`` the call names, positional or keyword):

- The *input* counts: the tensor(s) this rank hands in as data to send. Output buffers never
  count, so the receive-only sides count 0 bytes: ``recv``/``irecv``, ``broadcast`` and
  ``scatter`` on every rank but the source. ``batch_isend_irecv`` counts its ``isend`` ops.
- ``ring_bytes`` is what this rank sends under a bandwidth-optimal algorithm (ring, or direct
  for rooted and point-to-point ops), the busiest link's load:

  ======================================  =====================================
  all_reduce, all_reduce_coalesced        2(W-1)/W x input
  all_gather (list, single, coalesced)    (W-1) x input
  reduce_scatter (list, single)           input - this rank's own chunk
  all_to_all, all_to_all_single           input - this rank's own chunk
  broadcast                               input on the source, 0 elsewhere
  reduce                                  input off the destination, (W-1)/W x input on it
  gather                                  input off the destination, 0 on it
  scatter                                 input - own chunk on the source, 0 elsewhere
  send, isend, batch_isend_irecv sends    input
  ======================================  =====================================

- ``intra_bytes`` and ``inter_bytes`` split ``ring_bytes`` by the process group the call was issued on: inside
  a node when every rank of the group sits on one node, between nodes otherwise (the node of global rank r is
  r // ``LOCAL_WORLD_SIZE``, which torchrun and the lab's ranks set; unset: one node). So a flat all-reduce over
  ranks on two nodes counts whole as ``inter_bytes``: in a ring every step has a hop that crosses nodes, and
  the hops are sequential, so the crossing hops set the time.
- ``intra_hops`` and ``inter_hops`` count, by the same split, the call's sequential steps under that algorithm,
  each paying one link latency α: 2(W-1) for an all-reduce, W-1 for an all-gather, a reduce-scatter, an
  all-to-all and the rooted ops (a ring or a chain, as :func:`~commhooks_lab.studies.network.two_level_seconds`
  models a node's reduce and broadcast), 1 for a send (or a batch holding sends), 0 for a receive (the sender
  counts it). With the bytes they give any hook's two-level time, a learner's own hierarchy included.
- A call counts once: wrappers that call each other (``all_gather_into_tensor`` ->
  ``all_gather_single``, ``recv`` -> ``irecv``, object collectives -> ``all_gather``) are
  counted at the outermost patched call only (a per-thread depth guard).

Checked against the wire (torch 2.13, gloo, every built-in hook, tests/multiprocess/test_payload.py):
``wire_bytes = ring_bytes + 288 B x 2(W-1)`` per all-reduce, exactly at 2 ranks (576 B per
call) and within 2(W-1) elements per call at 4 ranks (gloo's ring chunks are whole elements).
A rank that only receives writes about 48 B per message (acknowledgements).

What it cannot see: ``ProcessGroup`` methods (``group.allreduce([t])``), functional collectives
(``torch.distributed._functional_collectives``) and DDP's built-in C++ allreduce. ``wire_bytes``
sees them all; :func:`unexplained_wire` tells when the counted calls cannot account for it.
"""

from __future__ import annotations

import inspect
import math
import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
import torch.distributed as dist

__all__ = [
    "crosses_nodes",
    "GATHER_OPS",
    "GLOO_BYTES_PER_MESSAGE",
    "hops",
    "PayloadCounter",
    "RULES",
    "unexplained_note",
    "unexplained_wire",
    "written_bytes",
]

#: What gloo adds to each message it sends (measured with torch 2.13, gloo, 2 and 4 ranks: 288 B
#: per ring message, 2(W-1) messages per all-reduce: 576 B at W=2, 1728 B at W=4).
GLOO_BYTES_PER_MESSAGE = 288
#: Printed warnings and the like that may fall into a step's window without being communication.
WIRE_SLACK_BYTES = 4096


def _nbytes(tensor) -> int:
    return tensor.numel() * tensor.element_size() if isinstance(tensor, torch.Tensor) else 0


def _total(tensors: Iterable | None) -> int:
    return sum(_nbytes(t) for t in tensors or ())


@dataclass(frozen=True)
class _Count:
    """One call's bytes: ``payload`` handed in, ``ring`` sent by the optimal algorithm, ``wire``
    the most any common backend's algorithm sends for it (gloo reduce-scatters by all-reducing,
    and broadcasts along a binomial tree), and the messages it may take."""

    payload: int
    ring: float
    wire: float
    messages: int


class _Call:
    """A collective's bound arguments, with the group facts the rules need."""

    def __init__(self, arguments: dict, group=None):
        self.a = arguments
        self.group = arguments.get("group", group)
        self.world = dist.get_world_size(self.group)
        self.rank = dist.get_rank(self.group)

    def is_root(self, key: str) -> bool:
        """Is this rank the call's ``src``/``dst`` (global rank) or ``group_src``/``group_dst``?"""
        group_root = self.a.get(f"group_{key}")
        if group_root is not None:
            return self.rank == group_root
        root = self.a.get(key)
        return dist.get_rank() == (0 if root is None else root)

    def own(self, tensors) -> int:
        """Bytes of this rank's own entry in a per-rank list (it stays here)."""
        tensors = list(tensors or ())
        return _nbytes(tensors[self.rank]) if 0 <= self.rank < len(tensors) else 0


def _ring(factor: Callable[[int], float], key: str, messages: Callable[[int], int]) -> Callable[[_Call], _Count]:
    def rule(call: _Call) -> _Count:
        value = call.a.get(key)
        size = _total(value) if isinstance(value, (list, tuple)) else _nbytes(value)
        ring = factor(call.world) * size
        return _Count(size, ring, ring, messages(call.world))

    return rule


def _all_reduce(key: str) -> Callable[[_Call], _Count]:
    return _ring(lambda w: 2 * (w - 1) / w, key, lambda w: 2 * (w - 1))


def _all_gather(key: str) -> Callable[[_Call], _Count]:
    return _ring(lambda w: float(w - 1), key, lambda w: w - 1)


def _reduce_scatter_list(call: _Call) -> _Count:
    inputs = call.a["input_list"]
    size = _total(inputs)
    allreduce = 2 * (call.world - 1) / call.world * size  # gloo: one all-reduce per chunk
    return _Count(size, size - call.own(inputs), allreduce, 2 * (call.world - 1) * max(1, len(inputs)))


def _reduce_scatter_single(call: _Call) -> _Count:
    size = _nbytes(call.a["input"])
    ring = (call.world - 1) / call.world * size
    return _Count(size, ring, 2 * ring, 2 * (call.world - 1))  # gloo all-reduces the whole input


def _all_to_all(call: _Call) -> _Count:
    inputs = call.a["input_tensor_list"]
    size = _total(inputs)
    sent = size - call.own(inputs)
    return _Count(size, sent, sent, call.world - 1)


def _all_to_all_single(call: _Call) -> _Count:
    tensor, splits = call.a["input"], call.a.get("input_split_sizes")
    size = _nbytes(tensor)
    if splits and tensor.dim() > 0 and tensor.shape[0]:
        own = splits[call.rank] * size // tensor.shape[0]
    else:
        own = size // call.world
    return _Count(size, size - own, size - own, call.world - 1)


def _broadcast(call: _Call) -> _Count:
    size = _nbytes(call.a["tensor"])
    tree = math.ceil(math.log2(call.world)) * size if call.world > 1 else 0  # gloo: a binomial tree
    if call.is_root("src"):
        return _Count(size, size, tree, max(1, math.ceil(math.log2(max(call.world, 2)))))
    return _Count(0, 0, tree, 1)  # a receiving rank may relay it in a tree


def _reduce(call: _Call) -> _Count:
    size = _nbytes(call.a["tensor"])
    sent = (call.world - 1) / call.world * size if call.is_root("dst") else size
    return _Count(size, sent, size, 2 * call.world)


def _gather(call: _Call) -> _Count:
    size = _nbytes(call.a["tensor"])
    return _Count(size, 0 if call.is_root("dst") else size, size, 1)


def _scatter(call: _Call) -> _Count:
    if not call.is_root("src"):
        return _Count(0, 0, 0, 1)
    inputs = call.a.get("scatter_list")
    size = _total(inputs)
    sent = size - call.own(inputs)
    return _Count(size, sent, sent, call.world - 1)


def _send(call: _Call) -> _Count:
    size = _nbytes(call.a["tensor"])
    return _Count(size, size, size, 1)


def _receive(call: _Call) -> _Count:
    return _Count(0, 0, 0, 1)


def _batch_isend_irecv(call: _Call) -> _Count:
    ops = call.a["p2p_op_list"]
    size = sum(_nbytes(op.tensor) for op in ops if getattr(op.op, "__name__", "") == "isend")
    return _Count(size, size, size, len(ops))


#: Every torch.distributed call that moves tensor data (torch 2.13), and how it counts.
RULES: dict[str, Callable[[_Call], _Count]] = {
    "all_reduce": _all_reduce("tensor"),
    "all_reduce_coalesced": _all_reduce("tensors"),
    "all_gather": _all_gather("tensor"),
    "all_gather_single": _all_gather("input_tensor"),
    "all_gather_into_tensor": _all_gather("input_tensor"),
    "_all_gather_base": _all_gather("input_tensor"),
    "all_gather_coalesced": _all_gather("input_tensor_list"),
    "reduce_scatter": _reduce_scatter_list,
    "reduce_scatter_single": _reduce_scatter_single,
    "reduce_scatter_tensor": _reduce_scatter_single,
    "_reduce_scatter_base": _reduce_scatter_single,
    "all_to_all": _all_to_all,
    "all_to_all_single": _all_to_all_single,
    "broadcast": _broadcast,
    "reduce": _reduce,
    "gather": _gather,
    "scatter": _scatter,
    "send": _send,
    "isend": _send,
    "recv": _receive,
    "irecv": _receive,
    "batch_isend_irecv": _batch_isend_irecv,
}
#: The calls whose bandwidth-optimal algorithm takes 2(W-1) steps (reduce-scatter, then all-gather); the rest of
#: the collectives take W-1, and point-to-point ones 1 for a send and 0 for a receive (:func:`hops`).
_TWO_PASSES = frozenset({"all_reduce", "all_reduce_coalesced"})
_POINT_TO_POINT = frozenset({"send", "isend", "recv", "irecv", "batch_isend_irecv"})


def hops(name: str, world: int, sends: bool) -> int:
    """Sequential steps of collective ``name`` on a group of ``world`` ranks, each one link latency (the module's
    docstring); ``sends``: does this rank send anything in it (for point-to-point calls)."""
    if name in _POINT_TO_POINT:
        return int(sends)
    return (2 if name in _TWO_PASSES else 1) * (world - 1)


#: The all-gather family: their copies multiply with the world size (the network model reads them apart).
GATHER_OPS = frozenset(name for name in RULES if "all_gather" in name)


def crosses_nodes(group) -> bool:
    """Does a collective on ``group`` leave a node (``LOCAL_WORLD_SIZE`` ranks per node, consecutive)?"""
    size = int(os.environ.get("LOCAL_WORLD_SIZE") or 0)
    if size <= 0 or size >= dist.get_world_size():
        return False
    if group is None or group is dist.group.WORLD:
        return True
    return len({r // size for r in dist.get_process_group_ranks(group)}) > 1


class PayloadCounter:
    """Counts the bytes handed to ``torch.distributed`` collectives while ``active``.

    It patches the functions once per process, in ``torch.distributed`` and in
    ``torch.distributed.distributed_c10d`` alike (the same wrapper in both, so ``P2POp``'s and
    the coalescing manager's identity checks still hold), so hooks that call them (PyTorch's,
    Accelerate's, yours), also from ``.then()`` callbacks on gloo's threads, are all seen.
    """

    _installed: PayloadCounter | None = None

    def __init__(self) -> None:
        self.active = False
        self._lock = threading.Lock()
        self._depth = threading.local()
        self.reset()

    @classmethod
    def install(cls) -> PayloadCounter:
        if cls._installed is None:
            from torch.distributed import distributed_c10d

            counter = cls()
            for name, rule in RULES.items():
                original = getattr(distributed_c10d, name, None) or getattr(dist, name, None)
                if original is None:
                    continue
                wrapper = counter._counting(name, original, rule)
                for module in (distributed_c10d, dist):
                    if getattr(module, name, None) is original:
                        setattr(module, name, wrapper)
            cls._installed = counter
        return cls._installed

    def _counting(self, name: str, original: Callable, rule: Callable[[_Call], _Count]) -> Callable:
        signature = inspect.signature(original)

        def collective(*args, **kwargs):
            depth = getattr(self._depth, "n", 0)
            if depth == 0 and self.active:
                self._count(name, rule, signature, args, kwargs)
            self._depth.n = depth + 1
            try:
                return original(*args, **kwargs)
            finally:
                self._depth.n = depth

        collective.__wrapped__ = original  # type: ignore[attr-defined]
        collective.__name__ = name
        collective.__qualname__ = getattr(original, "__qualname__", name)
        collective.__doc__ = original.__doc__
        return collective

    def _count(self, name: str, rule, signature: inspect.Signature, args: tuple, kwargs: dict) -> None:
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError:
            return  # the call itself will raise PyTorch's own error
        bound.apply_defaults()
        group = None
        if name == "batch_isend_irecv" and bound.arguments.get("p2p_op_list"):
            group = bound.arguments["p2p_op_list"][0].group
        call = _Call(bound.arguments, group)
        if call.rank < 0:
            return  # this rank is not in the call's group: the call moves nothing here
        count = rule(call)
        between = crosses_nodes(call.group)
        with self._lock:
            self.payload_bytes += count.payload
            self.ring_bytes += count.ring
            steps = hops(name, call.world, count.payload > 0)
            if between:
                self.inter_bytes += count.ring
                self.inter_hops += steps
            else:
                self.intra_bytes += count.ring
                self.intra_hops += steps
            self.wire_bound += count.wire
            self.messages += count.messages
            self.calls[name] = self.calls.get(name, 0) + 1
            self.bytes_by_op[name] = self.bytes_by_op.get(name, 0) + count.payload

    def reset(self) -> None:
        with self._lock:
            self.payload_bytes, self.ring_bytes, self.wire_bound, self.messages = 0, 0.0, 0.0, 0
            self.intra_bytes, self.inter_bytes = 0.0, 0.0
            self.intra_hops, self.inter_hops = 0, 0
            self.calls: dict[str, int] = {}
            self.bytes_by_op: dict[str, int] = {}


# -- the wire ------------------------------------------------------------------------------------


def written_bytes() -> int | None:
    """Bytes this process has written so far (all threads; ``/proc/self/io`` ``wchar``), or None off Linux."""
    try:
        with open("/proc/self/io", "rb") as f:
            for line in f:
                if line.startswith(b"wchar:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def unexplained_wire(wire_bytes: float | None, wire_bound: float, messages: int) -> float:
    """Bytes written beyond what the counted calls can explain (0 when they can, or off Linux).

    Counted calls explain up to ``wire_bound`` plus gloo's per-message overhead, plus
    ``WIRE_SLACK_BYTES`` for text printed during the step.
    """
    if wire_bytes is None or math.isnan(wire_bytes):
        return 0.0
    return max(0.0, wire_bytes - wire_bound - GLOO_BYTES_PER_MESSAGE * messages - WIRE_SLACK_BYTES)


def unexplained_note(gaps: list[float]) -> str | None:
    """A note when some steps wrote bytes that the counted collectives cannot account for."""
    bad = [g for g in gaps if g > 0]
    if not bad:
        return None
    return (
        f"wire_bytes: in {len(bad)} of {len(gaps)} steps this rank wrote up to {max(bad):,.0f} bytes more than the "
        "collectives the lab counted can explain, so payload_bytes undercounts. Something sent data the counter "
        "cannot see: a ProcessGroup method (group.allreduce([t])), functional collectives "
        "(torch.distributed._functional_collectives), or DDP's built-in C++ allreduce when no hook is registered."
    )
