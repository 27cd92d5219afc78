"""The warm session: one live :class:`~commhooks_lab.Cluster` per (world size, backend) for the whole kernel.

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

from . import Cluster
from .options import DEFAULT_TIMEOUT_S, check_launch_options, check_link
from .rank_server import DEFAULT_START_METHOD

__all__ = ["active", "close", "get_cluster", "warm"]

_lock = threading.Lock()
_clusters: dict[tuple[int, str, str | None], Cluster] = {}
_warming: list[threading.Thread] = []


def get_cluster(
    world_size: int = 2, backend: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S, link: str | None = None
) -> Cluster:
    """The session's Cluster for ``world_size`` ranks on ``backend`` (None: nccl with a GPU per rank, else gloo),
    behind ``link`` (None: the machine's loopback), one per link.

    Started on first use. ``timeout_s`` is fixed in the ranks' process group when they join it,
    so asking with another value replaces the Cluster (a new start).
    """
    resolved = check_launch_options(world_size, backend, timeout_s, DEFAULT_START_METHOD)
    parsed = check_link(link, DEFAULT_START_METHOD, resolved)
    key = (int(world_size), resolved, parsed.spec if parsed is not None else None)
    with _lock:
        cluster = _clusters.get(key)
        if cluster is not None and cluster.timeout_s != float(timeout_s):
            del _clusters[key]
            cluster.close()
            cluster = None
        if cluster is None:
            cluster = Cluster(world_size, backend=resolved, timeout_s=timeout_s, link=parsed)
            _clusters[key] = cluster
        return cluster


def warm(
    world_size: int = 2, backend: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S, link: str | None = None
) -> None:
    """Start the session's ranks in the background, so the next run finds them ready (HookLab does,
    while you read its controls). A failure here is left for that run to report."""

    def start() -> None:
        with contextlib.suppress(Exception):
            get_cluster(world_size, backend, timeout_s, link)

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
