"""Where a call's ranks come from, decided in one place: your Cluster, the session's warm ranks, or fresh ones.

``run``, ``compare``, ``HookLab``, ``%ddp`` and every study ask a :class:`Ranks` for the ranks a
:class:`~.rank_spec.RankSpec` describes, so the three policies (and the check that your Cluster fits) are
written once. A test in ``tests/multiprocess/test_architecture.py`` fails if a module above the launcher builds a
Cluster of its own.
"""

from __future__ import annotations

from .cluster import Cluster
from .rank_spec import RankSpec

__all__ = ["Ranks"]


class Ranks:
    """The ranks for each spec a call asks for: ``cluster`` if you gave one (refused if it does not fit the spec),
    else with ``fresh=True`` ranks started for the call (one set per spec, stopped by :meth:`close`), else the
    session's warm ranks (:mod:`.session`), which stay for the next call.

    ``with Ranks(cluster, fresh=fresh) as ranks: ranks(spec).run(...)``.
    """

    def __init__(self, cluster: Cluster | None = None, *, fresh: bool = False):
        if cluster is not None and fresh:
            raise ValueError("pass either cluster= (run on those ranks) or fresh=True (start new ranks), not both")
        self.cluster, self.fresh = cluster, fresh
        self._own: dict[RankSpec, Cluster] = {}

    def __call__(self, spec: RankSpec) -> Cluster:
        if self.cluster is not None:
            _check_fits(self.cluster, spec)
            return self.cluster
        if not self.fresh:
            from . import session

            return session.get_cluster(spec)
        if spec not in self._own:
            self._own[spec] = Cluster(spec)
        return self._own[spec]

    def close(self) -> None:
        """Stop the ranks started for this call (never yours, nor the session's)."""
        own, self._own = list(self._own.values()), {}
        for cluster in own:
            cluster.close()

    def __enter__(self) -> Ranks:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _check_fits(cluster: Cluster, spec: RankSpec) -> None:
    """Your Cluster must be the ranks the run asks for: as many, behind the same link, on the same backend."""
    if cluster.world_size != spec.world_size:
        raise ValueError(
            f"this Cluster has {cluster.world_size} ranks but the config asks for "
            f"world_size={spec.world_size}; make the Cluster with world_size={spec.world_size}"
        )
    if cluster.spec.link != spec.link:
        have = "no link" if cluster.spec.link is None else f"link={cluster.spec.link.spec!r}"
        wanted = None if spec.link is None else spec.link.spec
        raise ValueError(
            f"this Cluster's ranks sit behind {have} but the config asks for link={wanted!r}; make the "
            f"Cluster with link={wanted!r}, or leave out cluster="
        )
    if (cluster.spec.nodes, cluster.spec.intra_link) != (spec.nodes, spec.intra_link):
        have, wanted = _nodes(cluster.spec), _nodes(spec)
        raise ValueError(
            f"this Cluster's ranks are on {have} but the config asks for {wanted}; make the Cluster with "
            f"{wanted}, or leave out cluster="
        )
    if cluster.backend != spec.backend:
        raise ValueError(
            f"this Cluster's ranks talk over {cluster.backend} but the config asks for backend={spec.backend!r}; "
            f"make the Cluster with backend={spec.backend!r}, or leave out cluster="
        )


def _nodes(spec: RankSpec) -> str:
    """``nodes=2, intra_link='10gbit'``, as the options are written."""
    inside = "" if spec.intra_link is None else f", intra_link={spec.intra_link.spec!r}"
    return f"nodes={spec.nodes}{inside}"
