"""Independent runs shared out over several sets of warm ranks at once: the same results, sooner.

A short run spends much of each step waiting on its collectives (two ranks on two cores keep about 1.3
of them busy), so a second set of ranks fills those gaps. Every run is seeded and a warm rank keeps
nothing from one run to the next, so each result is bit for bit the one a run after another would give;
only the wall time changes. On a machine that is already busy there are no gaps to fill, and nothing is
gained.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..engine.config import ExperimentConfig
from ..experiment import as_configs, compare
from ..launcher import Cluster, Ranks
from ..result import ResultSet

__all__ = ["compare_side_by_side", "ranks_side_by_side"]


def compare_side_by_side(items: Sequence[Any], clusters: Sequence[Cluster], **changes) -> ResultSet:
    """``compare(items, **changes)`` with the runs shared out over ``clusters``; results in the order of ``items``.

    Every config is checked before any rank runs. A cluster that finishes a run takes the next one not yet
    started. The first error stops the handing out: the runs in flight end, then it is raised (a Ctrl-C too).
    """
    if not clusters:
        raise ValueError("compare_side_by_side needs at least one Cluster")
    sizes = {c.world_size for c in clusters}
    if len(sizes) > 1:
        raise ValueError(f"every cluster must have the same world size, got {sorted(sizes)}")
    configs = as_configs(items, None, "compare_side_by_side", **changes)
    for config in configs:
        config.check()
    results: list = [None] * len(configs)
    todo = iter(range(len(configs)))
    lock, stop = threading.Lock(), threading.Event()

    def next_run() -> int | None:
        with lock:
            return None if stop.is_set() else next(todo, None)

    def work(cluster: Cluster) -> None:
        try:
            while (i := next_run()) is not None:
                results[i] = compare([configs[i]], cluster=cluster)[0]
        except BaseException:
            stop.set()  # the other clusters finish what they run and take nothing new
            raise

    with ThreadPoolExecutor(len(clusters), thread_name_prefix="side-by-side") as pool:
        futures = [pool.submit(work, cluster) for cluster in clusters]
        try:
            for future in futures:
                future.result()
        except BaseException:
            stop.set()  # a Ctrl-C lands here, in the notebook's thread
            raise
    return ResultSet(results)


@contextlib.contextmanager
def ranks_side_by_side(cluster: Cluster | None, count: int, config: ExperimentConfig, fresh: bool = False):
    """``count`` sets of ranks: ``cluster`` (or the session's warm one for ``config``, or with ``fresh`` a new one)
    and ``count - 1`` more made like it for the moment; the ones made here are closed at the end."""
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise ValueError(f"side_by_side must be a whole number of sets of ranks, 1 or more; got {count!r}")
    with Ranks(cluster, fresh=fresh) as ranks, contextlib.ExitStack() as stack:
        cluster = ranks(config.rank_spec())  # yours, the session's, or a fresh one closed here
        extra = [stack.enter_context(cluster.sibling()) for _ in range(count - 1)]
        yield [cluster, *extra]
