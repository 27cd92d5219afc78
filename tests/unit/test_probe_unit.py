"""The probe in one process, without DDP: a stand-in bucket, world size 1. Fast checks of what the
multi-process tests cannot isolate: the device of everything it makes, and memory reuse."""

import gc

import pytest
import torch

from commhooks_lab.measure import scratch
from commhooks_lab.measure.probe import Probe


class Bucket:
    """What DDP hands a hook, for parameters whose .grad holds the local gradient."""

    def __init__(self, params):
        self.params = params
        self._buffer = torch.cat([p.grad.reshape(-1) for p in params])

    def buffer(self):
        return self._buffer

    def parameters(self):
        return self.params

    def gradients(self):
        out, start = [], 0
        for p in self.params:
            out.append(self._buffer[start : start + p.numel()].view_as(p))
            start += p.numel()
        return out

    def index(self):
        return 0

    def is_last(self):
        return True


def halving_hook(state, bucket):
    """A stand-in for communication: halves the bucket (so h != exact and every metric is non-trivial)."""
    future = torch.futures.Future()
    future.set_result(bucket.buffer().mul_(0.5))
    return future


def measure_steps(steps=3, flush_every=2, flush_bytes=32 << 20):
    torch.manual_seed(0)
    cpu = torch.device("cpu")  # the driver's own tensors are real; only the probe's are under test
    model = torch.nn.Sequential(torch.nn.Linear(6, 4, device=cpu), torch.nn.Linear(4, 3, device=cpu))
    probe = Probe(list(model.named_parameters()), world_size=1, rank=0, flush_bytes=flush_bytes)
    hook = probe.wrap(halving_hook)
    rows, layers = [], []
    for step in range(steps):
        for p in model.parameters():
            p.grad = torch.randn(p.shape, device=cpu)
        bucket = Bucket(list(model.parameters()))
        probe.start_step()
        result = hook(None, bucket).wait()
        for p, g in zip(model.parameters(), result.split([p.numel() for p in model.parameters()])):
            p.grad = g.view_as(p).clone()  # what DDP does with the future's value
        record = probe.end_step(torch.tensor(1.5 + step, device=cpu))
        record.update(step=step)
        if (step + 1) % flush_every == 0:
            flush = probe.flush()
            rows += flush[0]
            layers += flush[1]
    flush = probe.flush()
    return rows + flush[0], layers + flush[1], probe.sample()


def test_every_tensor_the_probe_makes_lives_on_the_gradients_device():
    """Under a meta default device, any factory call without device= would make a meta tensor and fail."""
    expected = measure_steps()
    gc.collect()
    scratch._SPARE.clear()  # no memory from the run above: every buffer is made under the meta default
    with torch.device("meta"):
        on_meta_default = measure_steps()
    assert on_meta_default == expected
    rows, layers, sample = expected
    assert [r["loss"] for r in rows] == [1.5, 2.5, 3.5]
    assert all(r["rel_error"] == pytest.approx(0.5) and r["cosine"] == pytest.approx(1.0) for r in rows)
    assert all(r["rank_spread"] == 0 for r in rows) and len(layers) == 3 * 4
    assert sample["layer"] == "0.weight" and sample["shape"] == [4, 6] and len(sample["hook"]) == 24


def test_the_metrics_are_those_of_the_definitions():
    rows, layers, sample = measure_steps(steps=2, flush_every=5)
    h, exact = torch.tensor(sample["hook"], dtype=torch.float64), torch.tensor(sample["exact"], dtype=torch.float64)
    last = [r for r in layers if r["step"] == 1 and r["layer"] == "0.weight"][0]
    assert last["rel_error"] == pytest.approx(((h - exact).norm() / exact.norm()).item(), rel=1e-12)
    assert last["cosine"] == pytest.approx((h.flatten() @ exact.flatten() / (h.norm() * exact.norm())).item())
    assert last["max_abs_error"] == (h - exact).abs().max().item()
    assert last["exact_norm"] == pytest.approx(exact.norm().item(), rel=1e-12)
    assert rows[1]["cumulative_rel_error"] == pytest.approx(0.5)  # h = exact / 2 every step


def test_steps_kept_past_flush_bytes_are_measured_the_same():
    """A caller that flushes later than should_flush() asks grows the blocks; nothing is lost or reordered."""
    assert measure_steps(steps=5, flush_every=9, flush_bytes=1) == measure_steps(steps=5, flush_every=1)


def test_memory_is_reused_by_the_next_probe_of_the_same_model():
    """A fresh large tensor is page-faulted in on first touch; the next run in a warm rank reuses the last one's."""
    model = torch.nn.Linear(64, 32)
    first = Probe(list(model.named_parameters()), world_size=1, rank=0)
    pointer = first._block(0).data_ptr()
    del first
    gc.collect()
    second = Probe(list(model.named_parameters()), world_size=1, rank=0)
    assert second._block(0).data_ptr() == pointer


def test_the_spare_memory_is_bounded():
    big = torch.empty(scratch.KEEP_BYTES // 4 + 1)  # float32: just over the bound
    scratch._give_back({"big": big}, [])
    scratch._give_back({"small": torch.empty(8)}, [])
    assert all(t.numel() == 8 for tensors in scratch._SPARE.values() for t in tensors)
