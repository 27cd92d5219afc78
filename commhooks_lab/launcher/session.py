"""The warm session: one live :class:`~commhooks_lab.Cluster` per :class:`~.rank_spec.RankSpec` for the whole kernel.

``lab.run``, ``lab.compare`` and ``HookLab`` hand their work to it, so only the first run of a
kernel pays for starting ranks; every run builds its model, data, DDP and hook state from scratch
inside them, so a run on warm ranks gives the same numbers, bit for bit, as one on fresh ranks.
``run(..., fresh=True)`` starts ranks of its own instead; ``cluster=`` uses yours. A worker error
stops the session's ranks and the next run starts new ones. ``close()`` stops them now; they also
stop when the interpreter exits.
"""

from __future__ import annotations

import atexit
import contextlib
import threading

from .cluster import Cluster, as_rank_spec
from .link_spec import Link
from .options import DEFAULT_START_METHOD, DEFAULT_TIMEOUT_S
from .rank_spec import RankSpec

__all__ = ["active", "close", "get_cluster", "warm"]

_lock = threading.Lock()
_clusters: dict[RankSpec, Cluster] = {}
_warming: list[threading.Thread] = []


def get_cluster(
    world_size: int | RankSpec = 2,
    backend: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    link: str | Link | None = None,
) -> Cluster:
    """The session's Cluster for a :class:`~.rank_spec.RankSpec` (or for ``world_size`` ranks on ``backend``,
    None: nccl with a GPU per rank, else gloo; behind ``link``, None: the machine's loopback).

    Started on first use. ``timeout_s`` is fixed in the ranks' process group when they join it,
    so asking with another value replaces the Cluster (a new start).
    """
    spec = as_rank_spec(world_size, backend, timeout_s, link, DEFAULT_START_METHOD)
    with _lock:
        cluster = _clusters.get(spec)
        if cluster is None:
            for other in [s for s in _clusters if _but_timeout(s) == _but_timeout(spec)]:
                _clusters.pop(other).close()
            cluster = _clusters[spec] = Cluster(spec)
        return cluster


def _but_timeout(spec: RankSpec) -> tuple:
    """A spec less its timeout: the session keeps one set of ranks for each, and a new timeout replaces it."""
    return (spec.world_size, spec.backend, spec.link, spec.start_method, spec.nodes, spec.intra_link)


def warm(ranks: int | RankSpec = 2) -> None:
    """Start the session's ranks for ``ranks`` (a world size, or a whole :class:`~.rank_spec.RankSpec`) in the
    background, so the next run finds them ready (HookLab does, while you read its controls). A failure here is
    left for that run to report."""

    def start() -> None:
        with contextlib.suppress(Exception):
            get_cluster(ranks)

    thread = threading.Thread(target=start, name="commhooks-session-warm", daemon=True)
    with _lock:
        _warming[:] = [t for t in _warming if t.is_alive()]
        _warming.append(thread)
    thread.start()


def active() -> list[Cluster]:
    """The session's Clusters whose ranks are running now."""
    with _lock:
        return [c for c in _clusters.values() if c.alive]


def close() -> None:
    """Stop every rank of the session now (the next run starts new ones). Safe to call any time."""
    for thread in list(_warming):  # a start under way ends first, then its ranks are stopped too
        thread.join()
    with _lock:
        clusters = list(_clusters.values())
        _clusters.clear()
    for cluster in clusters:
        cluster.close()


atexit.register(close)
