"""Compiling counts as progress: signs of life while Dynamo compiles, silence otherwise (so a real hang still times
out), and no step claimed (so no rank is reported behind while another compiles)."""

import time

import torch

from commhooks_lab.engine import compile_progress


class _Ctx:
    def __init__(self):
        self.beats: list[float] = []

    def heartbeat(self, step: int) -> None:
        raise AssertionError("a heartbeat claims a step: the notebook would report the other rank as behind")

    def alive(self) -> None:
        self.beats.append(time.monotonic())


def test_a_rank_beats_while_dynamo_compiles_and_is_silent_otherwise():
    ctx = _Ctx()

    def slow_to_trace(x):
        for _ in range(400):  # a few hundred ops: Dynamo takes a while to trace them
            x = torch.sin(x) + 1
        return x

    torch._dynamo.reset()  # it clears the callbacks too: the lab resets before it starts beating
    with compile_progress.beating(ctx, every_s=0.01) as progress:
        time.sleep(0.2)  # not compiling: no heartbeat
        assert ctx.beats == []
        torch.compile(slow_to_trace, backend="eager")(torch.ones(3))
        compiled = len(ctx.beats)
        time.sleep(0.2)
    assert compiled >= 1, ctx.beats
    assert len(ctx.beats) == compiled  # after compiling, silent again
    assert not progress.compiling.is_set()
    handler = torch._dynamo.callback_handler
    assert not handler.start_callbacks and not handler.end_callbacks  # nothing left registered
