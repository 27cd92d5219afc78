"""The compressor zoo: each compressor's defining property, honest bytes, and a correct DDP hook."""

import math

import matplotlib
import numpy as np
import pytest
import torch

import commhooks_lab as lab
from commhooks_lab import netmodel, plots, studies
from commhooks_lab.compressors import (
    QSGD,
    ErrorFeedback,
    Int8PerChannel,
    RandomK,
    ScaledSign,
    TernGrad,
    TopK,
    Where,
    pack_signs,
    unpack_signs,
)
from commhooks_lab.models import build_task

matplotlib.use("Agg")
pytestmark = pytest.mark.usefixtures("no_leftover_processes")


def where(step=0, key=0, rank=0):
    return Where(key=key, step=step, rank=rank, seed=0)


def test_topk_keeps_exactly_the_k_largest_magnitudes():
    x = torch.randn(1000, generator=torch.Generator().manual_seed(0))
    out = TopK(0.05).decode(TopK(0.05).encode(x, where()), x, where())
    kept = out != 0
    assert kept.sum() == 50
    assert x.abs()[kept].min() > x.abs()[~kept].max()
    assert torch.equal(out[kept], x[kept])


def test_randomk_draws_the_same_indices_on_every_rank():
    x = torch.randn(500)
    on_rank = [RandomK(0.1).encode(x, where(rank=r)) for r in (0, 1, 2)]
    assert all(torch.equal(p[0], on_rank[0][0]) for p in on_rank)
    assert (RandomK(0.1).decode(on_rank[0], x, where()) != 0).sum() == 50


@pytest.mark.parametrize("compressor, bound", [(QSGD(4), "qsgd"), (TernGrad(), "terngrad")])
def test_stochastic_quantizers_are_unbiased(compressor, bound):
    x = torch.randn(200, generator=torch.Generator().manual_seed(1))
    draws = 4000
    mean = sum(compressor.decode(compressor.encode(x, where(step=s)), x, where(step=s)) for s in range(draws)) / draws
    # per-element variance <= (norm/s)^2 / 4 for QSGD and max|x|^2 / 4 for TernGrad
    sigma = (x.norm() / compressor.levels if bound == "qsgd" else x.abs().max()) / 2
    tolerance = 5 * sigma / math.sqrt(draws)
    assert (mean - x).abs().max() < tolerance
    one = compressor.decode(compressor.encode(x, where()), x, where())
    assert not torch.allclose(one, x)  # a single draw is quantized, only the mean is exact


def test_sign_compressor_preserves_signs_and_packs_eight_per_byte():
    x = torch.randn(1001, generator=torch.Generator().manual_seed(2))
    payload = ScaledSign().encode(x, where())
    assert payload[0].dtype == torch.uint8 and payload[0].numel() == 126  # ceil(1001 / 8)
    out = ScaledSign().decode(payload, x, where())
    assert torch.equal(out.sign(), x.sign())
    assert torch.allclose(out.abs(), x.abs().mean().expand_as(out))
    assert torch.equal(unpack_signs(pack_signs(x), x.numel()), torch.where(x >= 0, 1.0, -1.0))


def test_int8_per_channel_error_is_within_half_a_step():
    x = torch.randn(16, 40, generator=torch.Generator().manual_seed(3))
    low, step = Int8PerChannel().encode(x, where())[1:]
    out = Int8PerChannel().decode(Int8PerChannel().encode(x, where()), x, where())
    assert ((out - x).abs() <= step[:, None] / 2 + 1e-6).all()


def test_error_feedback_residual_is_input_minus_what_was_sent():
    ef, memory = ErrorFeedback(TopK(0.1)), {}
    x1, x2 = torch.randn(100), torch.randn(100)
    sent1 = ef.decode(ef.compress(x1, where(step=0), memory), x1, where(step=0))
    assert torch.equal(memory[0], x1 - sent1)
    corrected = x2 + memory[0]
    sent2 = ef.decode(ef.compress(x2, where(step=1), memory), x2, where(step=1))
    assert torch.equal(sent2, TopK(0.1).decode(TopK(0.1).encode(corrected, where(step=1)), x2, where(step=1)))
    assert torch.equal(memory[0], corrected - sent2)


def test_error_feedback_keeps_no_state_on_the_compressor_object():
    """The memory is the hook state's: one object, two runs, two fresh starts (as PowerSGDState's error_dict)."""
    ef = ErrorFeedback(TopK(0.1))
    x = torch.randn(100, generator=torch.Generator().manual_seed(4))
    first, second = {}, {}
    payload_a = ef.compress(x, where(), first)
    payload_b = ef.compress(x, where(), second)  # a second run with the same object starts from zero
    assert all(torch.equal(a, b) for a, b in zip(payload_a, payload_b))
    assert vars(ef).keys() == {"inner", "name", "summable"}
    with pytest.raises(TypeError, match="keeps its residuals in the hook state"):
        ef.encode(x, where())
    states = [lab.compressors.make_state(ef)(None) for _ in range(2)]
    assert states[0].memory is not states[1].memory and states[0].compressor is ef


def analytic_payload(compressor, model="mlp") -> int:
    """Bytes one rank hands to collectives per step, from the parameter shapes alone."""
    total = 0
    for p in build_task(model, 0).model.parameters():
        n = p.numel()
        k = max(1, math.ceil(getattr(compressor, "ratio", 0) * n))
        rows = p.shape[0] if p.dim() > 1 else 1
        total += {
            "TopK": k * 8,
            "RandomK": k * 4,
            "ScaledSign": math.ceil(n / 8) + 4,
            "QSGD": n + 4,
            "TernGrad": n + 4,
            "Int8PerChannel": n + rows * 8,
        }[type(compressor).__name__]
    return total


ZOO = [TopK(0.01), RandomK(0.05), ScaledSign(), QSGD(16), TernGrad(), Int8PerChannel()]


@pytest.fixture(scope="module")
def zoo_runs():
    with lab.Cluster(world_size=2) as cluster:
        yield lab.compare(ZOO + [ErrorFeedback(c) for c in ZOO], steps=3, cluster=cluster)


@pytest.mark.parametrize("index", range(len(ZOO)))
def test_each_compressor_is_a_correct_ddp_hook_with_honest_bytes(zoo_runs, index):
    plain, with_ef = zoo_runs[index], zoo_runs[index + len(ZOO)]
    expected = analytic_payload(ZOO[index])
    for run in (plain, with_ef):
        assert (run.steps["rank_spread"] == 0).all() and run.ranks_agree
        assert (run.steps["payload_bytes"] == expected).all()
        assert run.steps["compressing"].all()
        assert (run.steps["rel_error"] > 0).all()
    if not ZOO[index].summable:  # all-gathered: the link carries every other rank's copy
        assert (plain.steps["allgather_bytes"] == expected).all()
    assert with_ef.name == f"{plain.name} + EF"


@pytest.fixture(scope="module")
def network_runs():
    return studies.network_study(steps=4, model="mlp")


def test_break_even_bandwidth_is_where_the_modelled_times_meet(network_runs):
    table = netmodel.break_even(network_runs, world_size=8)
    finite = table[np.isfinite(table["break_even_gbps"])]
    for _, row in finite.iterrows():
        model = netmodel.network_model(network_runs, bandwidths_gbps=[row["break_even_gbps"]], world_sizes=[8])
        times = model.set_index("hook")["step_ms"]
        assert times[row["hook"]] == pytest.approx(times["allreduce"], rel=1e-9)
    assert (table.set_index("hook").loc["int8 per-channel", "pays_off"]).startswith("never")  # gathers 7 x 1/4


def test_network_model_scales_bytes_with_the_ring(network_runs):
    model = netmodel.network_model(network_runs, bandwidths_gbps=[1.0], world_sizes=[2, 8], latency_us=0.0)
    ms = model.set_index(["hook", "world_size"])["comm_ms"]
    assert ms[("fp16", 8)] == pytest.approx(ms[("allreduce", 8)] / 2)
    assert ms[("allreduce", 8)] / ms[("allreduce", 2)] == pytest.approx((2 * 7 / 8) / (2 * 1 / 2))
    assert ms[("int8 per-channel", 8)] / ms[("int8 per-channel", 2)] == pytest.approx(7)
    assert set(model["hook"]) == {r.name for r in network_runs} - {"noop"}
    fig = plots.network_time(model, 8)
    assert len(fig.axes[0].get_lines()) == len(network_runs) - 1


def test_network_model_needs_its_reference_runs(network_runs):
    with pytest.raises(ValueError, match="noop"):
        netmodel.network_model([r for r in network_runs if r.name != "noop"])


def test_convergence_study_is_one_call_and_one_figure():
    results = studies.convergence_study(steps=4, eval_every=2, model="mlp")
    assert [r.name for r in results][:3] == ["allreduce", "fp16", "power_sgd r1"]
    assert "sign + EF" in [r.name for r in results]
    assert all(r.steps["accuracy"].notna().sum() == 2 for r in results)
    fig = plots.convergence(results)
    assert len(fig.axes[0].get_lines()) == len(fig.axes[1].get_lines()) == len(results)
