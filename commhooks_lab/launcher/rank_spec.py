"""Which ranks a run needs, as one checked value: how many, on which backend, how patient, behind which link, on
how many nodes, started how.

Every option is checked here, once, when the value is made (the backend chosen, the link parsed into its
:class:`~.link_spec.Link`, the nodes into a :class:`~.topology.Topology`), so what takes a :class:`RankSpec`
trusts it: the session keys its warm ranks by it, a :class:`~commhooks_lab.Cluster` starts from it, and each rank
receives it. Stdlib only, like the rank code that unpickles it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .link_spec import Link, as_link
from .options import DEFAULT_START_METHOD, DEFAULT_TIMEOUT_S, check_launch_options, check_link
from .topology import Topology, check_topology

__all__ = ["RankSpec"]


@dataclass(frozen=True, init=False)
class RankSpec:
    """``world_size`` ranks on this machine. ``backend`` None picks nccl where every rank gets a GPU of its own,
    else gloo; ``link`` (a spec such as ``"100mbit"``, or a :class:`~.link_spec.Link`) puts each rank behind a link
    of its own; ``timeout_s`` bounds a rank's silence and is fixed in the process group when the ranks join it.

    ``nodes`` (2 or more) groups the ranks into nodes of consecutive ranks: ``link`` is then each node's one uplink,
    shared by its ranks, and ``intra_link`` (None: no limit) each rank's link inside its node
    (:mod:`.topology`). With ``nodes=1`` (the default) every rank sits on one switch behind a ``link`` of its own.

    Made only checked: a wrong option is refused here, with what to do, before any process starts. (A spec
    unpickled in a rank is not checked again: the notebook checked it.)
    """

    world_size: int
    backend: str
    timeout_s: float
    link: Link | None
    start_method: str
    nodes: int
    intra_link: Link | None

    def __init__(
        self,
        world_size: int = 2,
        backend: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        link: Link | str | None = None,
        start_method: str = DEFAULT_START_METHOD,
        nodes: int = 1,
        intra_link: Link | str | None = None,
    ):
        resolved = check_launch_options(world_size, backend, timeout_s, start_method)
        # the nodes first: a wrong topology is refused as such, even where no link could be built
        topology = check_topology(int(world_size), nodes, as_link(link), intra_link)
        for name, value in (
            ("world_size", int(world_size)),
            ("backend", resolved),
            ("timeout_s", float(timeout_s)),
            ("link", check_link(link, start_method, resolved)),
            ("start_method", start_method),
            ("nodes", 1 if topology is None else topology.nodes),
            ("intra_link", None if topology is None else topology.intra),
        ):
            object.__setattr__(self, name, value)

    def replace(self, **changes) -> RankSpec:
        """This spec with ``changes``, checked again."""
        return dataclasses.replace(self, **changes)

    @property
    def topology(self) -> Topology | None:
        """The nodes and their links, or None: every rank on one switch (``nodes=1``)."""
        if self.nodes == 1:
            return None
        return Topology(self.nodes, self.world_size // self.nodes, self.link, self.intra_link)

    def describe(self) -> str:
        """``2 ranks behind 100mbit links``, ``4 ranks on 2 nodes x 2 ranks, 100mbit uplinks``: for messages."""
        if self.topology is not None:
            return f"{self.world_size} ranks on {self.topology.spec}"
        behind = f" behind {self.link.spec} links" if self.link is not None else ""
        return f"{self.world_size} ranks{behind}"
