"""Nodes on a laptop: ranks grouped into nodes, a fast switch inside each node, one slow uplink per node.

``RankSpec(4, nodes=2, link="100mbit")`` puts ranks 0-1 on node 0 and ranks 2-3 on node 1 (contiguous, as
torchrun numbers them). Inside a node every rank has a veth of its own into the node's switch, without a rate
limit, or at ``intra_link=`` where given: NVLink's place. Each node reaches the others through ONE veth pair, its
uplink to a top switch, with htb at ``link=``'s rate each way: a NIC on a switch, shared by the node's ranks, so
two ranks of a node sending across at once get half the rate each. :mod:`.netns_switch` builds it.

What ``link=`` means: without ``nodes=`` (``nodes=1``), each rank's own link into one switch; with ``nodes=2``
or more, each node's uplink. ``nodes=2`` without ``link=`` gives nodes by name only: each rank knows its node
(``LOCAL_WORLD_SIZE``, ``GROUP_RANK``), so hierarchical hooks run and the probe counts bytes and ring steps per
level, but every rank talks over this machine's loopback, so only a model can say how long the nodes would take.
That needs no namespaces: the hook challenge's two-node task runs this way on any machine. Stdlib only, like
:mod:`.link_spec`: the rank receives it before torch loads.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

from .link_spec import Link, as_link

__all__ = ["check_topology", "Topology"]


@dataclass(frozen=True)
class Topology:
    """``nodes`` nodes of ``ranks_per_node`` ranks each; each node behind ``uplink`` (None: nodes by name only, no
    network built), each rank behind ``intra`` (None: no limit) inside its node."""

    nodes: int
    ranks_per_node: int
    uplink: Link | None
    intra: Link | None = None

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node

    def node_of(self, rank: int) -> int:
        """The node ``rank`` sits on (torchrun's ``GROUP_RANK``)."""
        return rank // self.ranks_per_node

    def local_rank(self, rank: int) -> int:
        """``rank``'s place inside its node (torchrun's ``LOCAL_RANK``)."""
        return rank % self.ranks_per_node

    def ranks_of(self, node: int) -> list[int]:
        """The ranks on ``node``, in order: what a subgroup for the node holds."""
        return list(range(node * self.ranks_per_node, (node + 1) * self.ranks_per_node))

    @property
    def spec(self) -> str:
        """``2 nodes x 2 ranks, 100mbit uplinks``: as results record it."""
        if self.uplink is None:
            return f"{self.nodes} nodes x {self.ranks_per_node} ranks, by name only (loopback)"
        inside = "" if self.intra is None else f", {self.intra.spec} inside"
        return f"{self.nodes} nodes x {self.ranks_per_node} ranks, {self.uplink.spec} uplinks{inside}"

    def describe(self) -> str:
        """What the ranks sat behind, for a result's notes."""
        if self.uplink is None:
            return (
                f"{self.world_size} ranks on {self.nodes} nodes of {self.ranks_per_node} by name only: each rank "
                "knows its node, but all of them talk over this machine's loopback, so times say nothing of the "
                "nodes (the bytes and ring steps per level are exact: a model turns them into time)"
            )
        if self.intra is None:
            inside = "a veth each into their node's switch without a rate limit (loopback speed)"
        else:
            inside = f"a veth each into their node's switch limited to {self.intra.spec} each way"
        return (
            f"{self.world_size} ranks on {self.nodes} nodes of {self.ranks_per_node}: inside a node the ranks have "
            f"{inside}; each node reaches the others through one uplink limited to {self.uplink.spec} each way, "
            "shared by its ranks (tc htb on both ends of one veth pair into a top switch)"
        )

    def __str__(self) -> str:
        return self.spec


def _check_nodes(nodes: object, world_size: int) -> int:
    if isinstance(nodes, bool) or not isinstance(nodes, numbers.Integral):
        raise TypeError(f"nodes must be a whole number of nodes (nodes=2), got {type(nodes).__name__} {nodes!r}")
    if nodes < 1:
        raise ValueError(f"nodes must be at least 1 (1: every rank on one switch), got nodes={nodes}")
    if world_size % int(nodes):
        fits = [n for n in range(1, world_size + 1) if world_size % n == 0]
        raise ValueError(
            f"world_size={world_size} does not split into nodes={nodes} nodes of equal size: give nodes= one of "
            f"{fits}, or another world_size"
        )
    return int(nodes)


def check_topology(world_size: int, nodes: object, link: Link | None, intra_link: object) -> Topology | None:
    """The :class:`Topology` the options ask for (None with ``nodes=1``: every rank on one switch), refused here,
    before any process starts, with what to give. ``link``: already parsed; ``intra_link``: a spec or a Link."""
    count = _check_nodes(nodes, world_size)
    intra = as_link(intra_link, "intra_link")
    if count == 1:
        if intra_link is not None:
            raise ValueError(
                "intra_link= is the link inside a node, but there is one node (nodes=1): give nodes=2 or more, "
                "or leave out intra_link= (with one node, link= is each rank's own link)"
            )
        return None
    example = f"e.g. RankSpec({world_size}, nodes={count}, link='100mbit')"
    if link is None:
        if intra_link is not None:
            raise ValueError(
                f"intra_link= limits the link inside a node, but without link= the nodes have no network to limit "
                f"(nodes by name only, on loopback): give each node's uplink too, {example[:-1]}, "
                f"intra_link={intra_link!r}), or leave out intra_link="
            )
        return Topology(count, world_size // count, None)
    if link.rate_bits is None:
        raise ValueError(
            f"nodes={count} with link='unlimited' makes the nodes one: give the uplink a rate, {example}, or "
            "leave out link= for nodes by name only (each rank knows its node; every rank on loopback), or "
            "leave out nodes="
        )
    if intra is not None and intra.rate_bits is not None and intra.rate_bits < link.rate_bits:
        raise ValueError(
            f"intra_link={intra.spec!r} is slower than the uplink between nodes (link={link.spec!r}): inside a node "
            "is the fast part. Give intra_link= at least link='s rate, or leave it out (no limit inside a node)"
        )
    if intra is not None and intra.rate_bits is None and not intra.delay_ms:
        intra = None  # 'unlimited' inside a node is the default
    return Topology(count, world_size // count, link, intra)
