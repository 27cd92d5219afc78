"""``fsdp2_comm=``: which FSDP2 communication a run with ``api='fsdp2'`` uses, checked before any rank starts,
and the byte rule of each.

With ``api='fsdp2'`` the hook name still picks ``MixedPrecisionPolicy(reduce_dtype=...)`` (the dtype of FSDP2's
gradient buffers: ``allreduce`` float32, ``fp16``, ``bf16``). ``fsdp2_comm`` picks what moves them:

- ``None``: PyTorch's own reduce-scatter, one mesh of every rank (what ``api='fsdp2'`` always did);
- ``"wire16_reduce_scatter[dtype=float16,error_feedback=false]"``: ``set_custom_reduce_scatter`` with the lab's
  :class:`~commhooks_lab.engine.fsdp2_comms.Wire16ReduceScatter` (16-bit all-to-all, float32 sums), one comm per
  module so that error feedback keeps one memory per module;
- ``"hsdp"``: FSDP2's native HSDP, a 2-D mesh (replicate across ``nodes``, shard inside each), whose replica
  all-reduce is float32: the baseline the next one is held to;
- ``"hsdp_wire16[dtype=float16]"``: FSDP on each node's ranks, and ``set_all_reduce_hook`` with
  :class:`~commhooks_lab.engine.fsdp2_comms.Wire16ReplicaAllReduce` averaging the replicas itself (16-bit wire).

Stdlib only: the notebook's kernel checks a config without importing FSDP.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ..hooks.choice import parse_spec
from ..hooks.traffic import Shape, numel

__all__ = [
    "COMMS",
    "Fsdp2Comm",
    "check_fsdp2_comm",
    "fsdp2_traffic",
    "parse_fsdp2_comm",
    "run_name",
    "split_by_node",
    "wire_dtype",
]

_WIRE_DTYPES = ("float16", "bfloat16", "float32")


@dataclass(frozen=True)
class Fsdp2Comm:
    """One ``fsdp2_comm=`` choice: what it does, the options it takes, and whether it needs nodes (HSDP)."""

    name: str
    summary: str
    defaults: Callable[[], dict]
    hsdp: bool


COMMS = {
    comm.name: comm
    for comm in (
        Fsdp2Comm(
            "wire16_reduce_scatter",
            "set_custom_reduce_scatter: dtype on the wire (an all-to-all), float32 sums, optional error feedback",
            lambda: {"dtype": "float16", "error_feedback": False},
            hsdp=False,
        ),
        Fsdp2Comm(
            "hsdp",
            "FSDP2's native HSDP: shard inside each node, float32 all-reduce of the shards across nodes",
            dict,
            hsdp=True,
        ),
        Fsdp2Comm(
            "hsdp_wire16",
            "FSDP inside each node, set_all_reduce_hook averaging the replicas: dtype wire, float32 sums",
            lambda: {"dtype": "float16"},
            hsdp=True,
        ),
    )
}


def parse_fsdp2_comm(spec: str | None) -> tuple[str | None, dict]:
    """``"wire16_reduce_scatter[dtype=bfloat16]"`` -> its name and options over the defaults; None -> (None, {})."""
    if spec is None:
        return None, {}
    if not isinstance(spec, str):
        raise TypeError(f"fsdp2_comm must be a name such as 'wire16_reduce_scatter' or None, got {spec!r}")
    name, options = parse_spec(spec)
    comm = COMMS.get(name)
    if comm is None:
        raise ValueError(f"unknown fsdp2_comm {name!r}; choose one of {list(COMMS)} (or None: PyTorch's own)")
    defaults = comm.defaults()
    for key, value in options.items():
        if key not in defaults:
            taken = f"it takes {sorted(defaults)}" if defaults else "it takes no options"
            raise ValueError(f"unknown option {key!r} for fsdp2_comm {name!r}: {taken}")
        if isinstance(defaults[key], bool) and not isinstance(value, bool):
            raise ValueError(f"fsdp2_comm {name!r} option {key} must be true or false, got {value!r}")
    merged = {**defaults, **options}
    if "dtype" in merged and merged["dtype"] not in _WIRE_DTYPES:
        raise ValueError(f"fsdp2_comm {name!r}: dtype is the format on the wire, one of {_WIRE_DTYPES}, got "
                         f"{merged['dtype']!r}")  # fmt: skip
    return name, merged


def check_fsdp2_comm(spec: str | None, api: str, hook_dtype: str | None, world_size: int, nodes: int) -> None:
    """Refuse a comm the run cannot use, before any rank starts: wrong api, HSDP without nodes of 2+ ranks."""
    name, _ = parse_fsdp2_comm(spec)
    if name is None:
        return
    if api != "fsdp2":
        raise ValueError(
            f"fsdp2_comm={spec!r} is FSDP2's communication and api={api!r} runs DDP, whose hook is hook=: pass "
            "api='fsdp2' (the hook name then picks FSDP2's reduce_dtype), or drop fsdp2_comm="
        )
    comm = COMMS[name]
    if comm.hsdp and (nodes < 2 or world_size // nodes < 2):
        per_node = world_size // max(nodes, 1)
        raise ValueError(
            f"fsdp2_comm={name!r} is HSDP: it shards inside each node and replicates across nodes, so it needs "
            f"nodes=2 or more with 2 or more ranks each; got world_size={world_size}, nodes={nodes} "
            f"({per_node} rank(s) per node). Use e.g. world_size=4, nodes=2, link='100mbit'"
        )
    if name == "hsdp_wire16" and hook_dtype != "float32":
        raise ValueError(
            f"fsdp2_comm='hsdp_wire16' averages float32 shards (hook='allreduce'); with hook giving reduce_dtype="
            f"{hook_dtype} FSDP would round the shards before its hook: use hook='allreduce' and the comm's dtype="
        )


def run_name(hook_name: str, spec: str | None) -> str:
    """A run's name that tells the comms apart: ``allreduce`` (PyTorch's own), ``allreduce+hsdp``,
    ``allreduce+wire16_reduce_scatter float16 error_feedback``."""
    name, options = parse_fsdp2_comm(spec)
    if name is None:
        return hook_name
    said = [str(options["dtype"])] if "dtype" in options else []
    said += ["error_feedback"] if options.get("error_feedback") else []
    return " ".join([f"{hook_name}+{name}", *said])


def wire_dtype(spec: str | None, hook_dtype: str) -> str:
    """The dtype the gradients travel in: the comm's ``dtype``, else the reduce_dtype."""
    name, options = parse_fsdp2_comm(spec)
    return options.get("dtype", hook_dtype) if name is not None else hook_dtype


_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


def _padded_shard(shapes: Sequence[Shape], world: int) -> int:
    """Elements of one rank's shard of these parameters: FSDP2 chunks dim 0 into ceil(d0/W) rows each, padded."""
    return sum(math.ceil(s[0] / world) * numel(s[1:]) for s in shapes if numel(s))


def _groups(spec: str | None, world_size: int, nodes: int) -> tuple[int, int]:
    """(the ranks FSDP shards over, the replicas): every rank and 1, or under HSDP a node's ranks and the nodes."""
    name, _ = parse_fsdp2_comm(spec)
    if name is not None and COMMS[name].hsdp:
        return world_size // nodes, nodes
    return world_size, 1


#: Each collective's share of its payload sent by a rank (ring, or direct for the all-to-all), from its group's size.
_SENT: dict[str, Callable[[int], float]] = {
    "all_gather_single": lambda w: w - 1,
    "all_gather": lambda w: w - 1,
    "reduce_scatter_single": lambda w: (w - 1) / w,
    "all_to_all_single": lambda w: (w - 1) / w,
    "all_reduce": lambda w: 2 * (w - 1) / w,
}


def split_by_node(by_op: Mapping[str, float], spec: str | None, world_size: int, nodes: int) -> tuple[float, float]:
    """(``intra_bytes``, ``inter_bytes``): the ring bytes this rank sends (the counting rules' algorithms) on groups
    inside one node, and on groups that span nodes, from the payload handed to each op.

    The probe's definition for DDP hooks: a collective over a group that spans nodes counts whole as between
    nodes (its sequential hops are as slow as the crossing ones). Under HSDP the shard collectives
    (``reduce_scatter_single``, ``all_gather_single``) stay in a node and the replica ones (``all_reduce``, the
    hook's ``all_to_all_single`` and ``all_gather``) span them; on one mesh of every rank over 2+ nodes, all span.
    """
    shard_world, replicas = _groups(spec, world_size, nodes)
    intra = inter = 0.0
    for op, payload in by_op.items():
        if op not in _SENT:
            raise ValueError(f"no byte rule for {op!r} in an FSDP2 run")
        replica_op = replicas > 1 and op in ("all_reduce", "all_to_all_single", "all_gather")
        sent = payload * _SENT[op](replicas if replica_op else shard_world)
        if replica_op or (replicas == 1 and nodes > 1):
            inter += sent
        else:
            intra += sent
    return intra, inter


def fsdp2_traffic(
    spec: str | None,
    modules: Sequence[tuple[Sequence[Shape], bool]],
    world_size: int,
    nodes: int = 1,
    reduce_dtype: str = "float32",
) -> dict[str, float]:
    """The byte rule: what one rank hands to each collective in one backward (``<op>_bytes``, the payload as
    ``PayloadCounter`` counts it, and ``payload_bytes``), and ``intra_bytes``/``inter_bytes``
    (:func:`split_by_node`).

    ``modules``: each ``fully_shard``-ed module's own parameter shapes, and whether it re-gathers them in backward
    (every module but the root, which FSDP2 keeps unsharded after forward). Parameters are float32.
    """
    name, options = parse_fsdp2_comm(spec)
    shard_world, replicas = _groups(spec, world_size, nodes)
    out: dict[str, float] = {}

    def add(op: str, payload: float) -> None:
        out[f"{op}_bytes"] = out.get(f"{op}_bytes", 0.0) + payload

    for shapes, regathers in modules:
        shard = _padded_shard(shapes, shard_world)
        if shard == 0 or shard_world == 1:  # one rank: FSDP2 copies, no collective
            continue
        if regathers:  # the parameters, all-gathered again for backward
            add("all_gather_single", 4 * shard)
        if name == "wire16_reduce_scatter":
            add("all_to_all_single", _BYTES[options["dtype"]] * shard * shard_world)
        else:
            add("reduce_scatter_single", _BYTES[reduce_dtype] * shard * shard_world)
        if name == "hsdp":
            add("all_reduce", _BYTES[reduce_dtype] * shard)
        elif name == "hsdp_wire16":  # each rank's shard cut into one piece per replica
            piece = math.ceil(shard / replicas) * _BYTES[options["dtype"]]
            add("all_to_all_single", piece * replicas)
            add("all_gather", piece)
    by_op = {op.removesuffix("_bytes"): b for op, b in out.items()}
    out["payload_bytes"] = sum(by_op.values())
    out["intra_bytes"], out["inter_bytes"] = split_by_node(by_op, spec, world_size, nodes)
    return out
