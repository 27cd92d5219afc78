"""The lab's probe around hooks a learner registers by hand (``%%ddp --measure``), and each backward as a step.

``lab.run`` knows where its steps start and end; a learner's loop in a notebook cell does not tell. Inside
:func:`probing`, ``DistributedDataParallel.register_comm_hook`` registers the hook inside a :class:`Probe` on
the model's parameters, and the probe marks the steps itself: a backward's first bucket starts one, and it ends
once DDP has written the averaged gradients into ``.grad`` (an autograd callback queued behind DDP's own
``finalize_backward``). :func:`measure_steps` then measures every step recorded so far, in float64 against the
exact mean, as for every lab run. Every rank must call it at the same point (it communicates).
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

from .probe import Probe

__all__ = ["COLUMNS", "measure_steps", "probing"]

#: What a measured step shows in a notebook (every column of the lab's step rows is in the DataFrame).
COLUMNS = ["hook", "step", "rel_error", "cosine", "rank_spread", "payload_bytes", "payload_vs_fp32", "buckets"]


def _stepping(probe: Probe, probed, name: str):
    """``probed`` (the probe's wrapper around the learner's hook), with the step's start and end marked."""
    engine = torch.autograd.Variable._execution_engine
    in_step, steps = [False], [0]

    def end() -> None:
        in_step[0] = False
        record = probe.end_step(torch.tensor(math.nan, dtype=torch.float64))  # the cell's loss is its own
        record.update(step=steps[0], hook=name)
        steps[0] += 1

    def hook(state, bucket):  # DDP checks that the second argument is named 'bucket'
        if not in_step[0]:
            in_step[0] = True
            probe.start_step()
        future = probed(state, bucket)
        if bucket.is_last():
            # DDP queues finalize_backward (which writes .grad) after this hook returns; a callback queued
            # from a callback runs after it (the engine runs callbacks added while it runs them).
            engine.queue_callback(lambda: engine.queue_callback(end))
        return future

    return hook


@contextlib.contextmanager
def probing(ctx, probes: list[Probe]):
    """While inside, a hook registered on a DDP model runs inside a new probe (appended to ``probes``)."""
    original = DistributedDataParallel.register_comm_hook

    def register_comm_hook(self, state: object, hook: Any) -> None:
        probe = Probe(list(self.module.named_parameters()), ctx.world_size, ctx.rank)
        probes.append(probe)
        name = getattr(hook, "__name__", type(hook).__name__)
        wrapped = _stepping(probe, probe.wrap(hook, wait=ctx.backend == "gloo"), name)
        return original(self, state, wrapped)

    DistributedDataParallel.register_comm_hook = register_comm_hook  # type: ignore[method-assign]
    try:
        yield
    finally:
        DistributedDataParallel.register_comm_hook = original  # type: ignore[method-assign]


def measure_steps(probes: list[Probe]):
    """Every step the probes recorded since the last call, measured: a DataFrame on rank 0, None elsewhere."""
    import pandas as pd

    rows: list[dict] = []
    for probe in probes:
        if probe.records:
            rows.extend(probe.flush(final=False)[0])
    if not rows:
        return None
    table = pd.DataFrame(rows)
    table["payload_vs_fp32"] = table["payload_bytes"] / table["uncompressed_bytes"]
    return table
