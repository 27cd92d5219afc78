"""Which ranks a run needs, as one checked value: how many, on which backend, how patient, behind which link, started
how.

Every option is checked here, once, when the value is made (the backend chosen, the link parsed into its
:class:`~.link_spec.Link`), so what takes a :class:`RankSpec` trusts it: the session keys its warm ranks by it,
a :class:`~commhooks_lab.Cluster` starts from it, and each rank receives it. Stdlib only, like the rank code that
unpickles it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .link_spec import Link
from .options import DEFAULT_START_METHOD, DEFAULT_TIMEOUT_S, check_launch_options, check_link

__all__ = ["RankSpec"]


@dataclass(frozen=True, init=False)
class RankSpec:
    """``world_size`` ranks on this machine. ``backend`` None picks nccl where every rank gets a GPU of its own,
    else gloo; ``link`` (a spec such as ``"100mbit"``, or a :class:`~.link_spec.Link`) puts each rank behind a link
    of its own; ``timeout_s`` bounds a rank's silence and is fixed in the process group when the ranks join it.

    Made only checked: a wrong option is refused here, with what to do, before any process starts. (A spec
    unpickled in a rank is not checked again: the notebook checked it.)
    """

    world_size: int
    backend: str
    timeout_s: float
    link: Link | None
    start_method: str

    def __init__(
        self,
        world_size: int = 2,
        backend: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        link: Link | str | None = None,
        start_method: str = DEFAULT_START_METHOD,
    ):
        resolved = check_launch_options(world_size, backend, timeout_s, start_method)
        for name, value in (
            ("world_size", int(world_size)),
            ("backend", resolved),
            ("timeout_s", float(timeout_s)),
            ("link", check_link(link, start_method, resolved)),
            ("start_method", start_method),
        ):
            object.__setattr__(self, name, value)

    def replace(self, **changes) -> RankSpec:
        """This spec with ``changes``, checked again."""
        return dataclasses.replace(self, **changes)

    def describe(self) -> str:
        """``2 ranks behind 100mbit links``: for messages."""
        behind = f" behind {self.link.spec} links" if self.link is not None else ""
        return f"{self.world_size} ranks{behind}"
