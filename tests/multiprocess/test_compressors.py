"""The compressor zoo: each compressor's defining property, honest bytes, and a correct DDP hook."""

import math

import matplotlib
import numpy as np
import pandas as pd
import pytest
import torch

import commhooks_lab as lab
from commhooks_lab import plots
from commhooks_lab.engine.models import build_task
from commhooks_lab.hooks.compressors import (
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
from commhooks_lab.studies import convergence as studies
from commhooks_lab.studies import network as netmodel

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


def round_trip(compressor, x, step=0):
    """encode (through compress, with error feedback's memory) then decode; every tensor made on the way."""
    memory = {}
    payload = compressor.compress(x, where(step=step), memory)
    return payload, compressor.decode(payload, x, where(step=step)), list(memory.values())


@pytest.mark.parametrize(
    "compressor",
    [TopK(0.1), RandomK(0.1), ScaledSign(), QSGD(4), TernGrad(), Int8PerChannel(), ErrorFeedback(QSGD(4))],
    ids=lambda c: c.name,
)
def test_compressors_make_every_tensor_on_the_gradients_device(compressor):
    """Under a meta default device, a factory call that forgets device= (random draws included) makes a meta
    tensor: the round trip then fails or differs. NCCL runs need the same care (no GPU here)."""
    x = torch.randn(12, 10, generator=torch.Generator().manual_seed(5))
    zero = torch.zeros(12, 10)  # the all-zero branches of QSGD and TernGrad
    expected = [round_trip(compressor, t) for t in (x, zero)]
    with torch.device("meta"):
        got = [round_trip(compressor, t) for t in (x, zero)]
    for (payload, out, memory), (payload_meta, out_meta, memory_meta) in zip(expected, got):
        for a, b in zip([*payload, out, *memory], [*payload_meta, out_meta, *memory_meta]):
            assert b.device == x.device and torch.equal(a, b)


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
def zoo_cluster():
    with lab.Cluster(world_size=2) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def zoo_runs(zoo_cluster):
    return lab.compare(ZOO + [ErrorFeedback(c) for c in ZOO], steps=3, cluster=zoo_cluster)


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


@pytest.mark.parametrize("compressor", [ErrorFeedback(TopK(0.05)), RandomK(0.05)], ids=lambda c: c.name)
def test_the_compressor_hook_makes_every_tensor_on_the_gradients_device(zoo_cluster, compressor):
    """The whole hook (payload packing, all-gather buffers, decoding, the future) under a meta default device."""
    import _collective_hooks

    plain = lab.run(hook=compressor, steps=3, cluster=zoo_cluster)
    meta = lab.run(
        hook=_collective_hooks.compressor_hook_on_meta_default,
        state_factory=lab.compressors.make_state(compressor),
        steps=3,
        cluster=zoo_cluster,
    )
    assert meta.final["param_digests"] == plain.final["param_digests"]
    assert list(meta.steps["payload_bytes"]) == list(plain.steps["payload_bytes"])


def test_a_reused_error_feedback_object_starts_each_run_from_zero(zoo_cluster):
    """Two runs in one rank process with one compressor object (as under torchrun): the second starts from zero."""
    from commhooks_lab.engine.dispatch import run_configs

    config = lab.ExperimentConfig(hook=ErrorFeedback(TopK(0.01)), steps=3)
    choice = config.check()
    first, second = zoo_cluster.run(run_configs, [config, config], [choice, choice])[0]
    assert first["param_digest"] == second["param_digest"]
    assert [s["rel_error"] for s in first["steps"]] == [s["rel_error"] for s in second["steps"]]


# -- the network model and the studies of notebook 8 ----------------------------------------------------

RULES = [
    ("allreduce", {}),
    ("fp16", {}),
    ("bf16", {}),
    ("power_sgd", {"matrix_approximation_rank": 1}),
    ("power_sgd", {"matrix_approximation_rank": 2}),
    ("power_sgd", {"matrix_approximation_rank": 5}),  # the MLP's 10 x 128 layer switches to plain all-reduce
    ("power_sgd", {"matrix_approximation_rank": 22}),  # no matrix is worth compressing: all plain
    ("batched_power_sgd", {"matrix_approximation_rank": 2}),  # the bucket as one square matrix
    ("noop", {}),
    ("topk", {"ratio": 0.01, "error_feedback": True}),
    ("randomk", {"ratio": 0.05}),
    ("sign", {"error_feedback": True}),
    ("qsgd", {"levels": 16}),
    ("terngrad", {}),
    ("int8", {}),
]


@pytest.fixture(scope="module")
def rule_runs():
    with lab.Cluster(world_size=2) as cluster:
        runs = {}
        for model in ("mlp", "cnn"):
            items = [
                {"hook": hook, "state_options": {**options, **({"start_powerSGD_iter": 2} if "power" in hook else {})}}
                for hook, options in RULES
            ]
            runs[model] = lab.compare(items, model=model, steps=3, measure=False, cluster=cluster)
        small = lab.compare(
            [{"hook": "power_sgd", "state_options": {"start_powerSGD_iter": 2}}],  # compresses after the rebuild
            model="cnn", steps=3, measure=False, bucket_cap_mb=0.01, cluster=cluster,
        )  # fmt: skip
        yield runs, small


@pytest.mark.parametrize("model", ["mlp", "cnn"])
def test_byte_rules_predict_the_measured_bytes_and_calls(rule_runs, model):
    shapes = netmodel.parameter_shapes(build_task(model, 0).model)
    for run in rule_runs[0][model]:
        hook, options = netmodel.rule_for(run)
        # PowerSGD sends plain all-reduce before start_powerSGD_iter, even when no matrix qualifies (r22)
        late = lab.Result(run.config, run.steps.iloc[2:], run.layers)
        assert netmodel.traffic(late) == netmodel.rule_traffic(shapes, hook, **options), run.name


def test_bucket_count_follows_ddps_caps_and_sets_the_calls(rule_runs):
    shapes = netmodel.parameter_shapes(build_task("cnn", 0).model)
    buckets = netmodel.bucket_count(shapes, bucket_cap_mb=0.01)
    assert buckets == 3 and netmodel.bucket_count(shapes) == 1
    for run in rule_runs[1]:
        assert (run.steps["buckets"].iloc[1:] == buckets).all()  # DDP rebuilds its buckets after step 0
        hook, options = netmodel.rule_for(run)
        assert netmodel.traffic(run) == netmodel.rule_traffic(shapes, hook, buckets=buckets, **options)
    # DDP's defaults: a 1 MiB first bucket, then 25 MiB ones, each closed once it reaches its cap
    assert netmodel.bucket_count([(2**18,)] * 3) == 2 and netmodel.bucket_count([(2**18,)]) == 1


def test_rule_for_refuses_runs_it_cannot_name(rule_runs):
    run = rule_runs[0]["mlp"][0]
    hookless = lab.Result({**run.config, "hook": "compressor:topk 1%"}, run.steps, run.layers)
    with pytest.raises(ValueError, match="registry name"):
        netmodel.rule_for(hookless)
    with pytest.raises(ValueError, match="no byte rule"):
        netmodel.rule_traffic([(4, 4)], "wire16_sum32")


def test_architectures_have_the_published_parameter_counts():
    models = netmodel.architectures()
    counts = {name: netmodel.parameter_count(shapes) for name, shapes in models.items()}
    assert counts["ResNet-18"] == 11_689_512 and counts["ResNet-50"] == 25_557_032
    assert counts["BERT-base"] == 109_482_240 and counts["GPT-2 small"] == 124_439_808
    assert counts["digits MLP (this lab)"] == 9_610 and counts["digits CNN (this lab)"] == 9_930


def test_bytes_by_model_and_by_world_size():
    models = netmodel.architectures()
    hooks = {"allreduce": ("allreduce", {}), "fp16": ("fp16", {}), "topk": ("topk", {"ratio": 0.01})}
    table = netmodel.bytes_table(models, hooks, world_size=8).set_index(["model", "hook"])
    assert table.loc[("GPT-2 small", "fp16"), "link_vs_fp32"] == pytest.approx(0.5)
    assert table.loc[("GPT-2 small", "topk"), "link_vs_fp32"] == pytest.approx(7 * 0.08 / 1.75 / 4, rel=1e-3)
    sweep = netmodel.world_size_sweep(models["GPT-2 small"], hooks, [2, 8, 64]).set_index(["hook", "world_size"])
    link = sweep["link_bytes"]
    assert link[("topk", 64)] / link[("topk", 8)] == pytest.approx(63 / 7)  # all-gathered: grows with W
    assert link[("fp16", 64)] / link[("fp16", 8)] == pytest.approx((2 * 63 / 64) / (2 * 7 / 8))
    fig = plots.bytes_by_model(netmodel.bytes_table(models, hooks, world_size=8))
    assert len(fig.axes[0].get_lines()) == 3 and len(fig.axes[0].get_xticklabels()) == len(models)
    assert len(plots.bytes_by_world_size(sweep.reset_index()).axes[0].get_lines()) == 3


def gpt2_traffics():
    shapes = netmodel.architectures(include_lab_models=False)["GPT-2 small"]
    rules = {"allreduce": ("allreduce", {}), "fp16": ("fp16", {}), "power_sgd r1": ("power_sgd", {}),
             "topk": ("topk", {"ratio": 0.01})}  # fmt: skip
    return {name: netmodel.rule_traffic(shapes, hook, **options) for name, (hook, options) in rules.items()}


@pytest.mark.parametrize("overlap", [0.0, 0.5])
@pytest.mark.parametrize("baseline", ["allreduce", "fp16"])
def test_break_even_bandwidth_is_where_the_modelled_times_meet(overlap, baseline):
    traffics = gpt2_traffics()
    costs = {"fp16": 0.01, "power_sgd r1": 0.05, "topk": 0.2}
    table = netmodel.break_even(traffics, costs, world_size=8, overlap=overlap, baseline=baseline)
    finite = table[np.isfinite(table["break_even_gbps"])]
    assert len(finite) >= 2
    for _, row in finite.iterrows():
        model = netmodel.network_model(
            traffics, costs, bandwidths_gbps=[row["break_even_gbps"]], world_sizes=[8], overlap=overlap,
            baseline=baseline,
        )  # fmt: skip
        times = model.set_index("hook")["step_ms"]
        assert times[row["hook"]] == pytest.approx(times[baseline], rel=1e-9)


def test_network_model_scales_bytes_with_the_ring_and_hides_only_asynchronous_hooks():
    traffics = gpt2_traffics()
    model = netmodel.network_model(traffics, bandwidths_gbps=[1.0], world_sizes=[2, 8], latency_us=0.0)
    ms = model.set_index(["hook", "world_size"])["comm_ms"]
    assert ms[("fp16", 8)] == pytest.approx(ms[("allreduce", 8)] / 2)
    assert ms[("allreduce", 8)] / ms[("allreduce", 2)] == pytest.approx((2 * 7 / 8) / (2 * 1 / 2))
    assert ms[("topk", 8)] / ms[("topk", 2)] == pytest.approx(7)
    hidden = netmodel.network_model(traffics, bandwidths_gbps=[1.0], world_sizes=[8], latency_us=0.0, overlap=0.5)
    hidden_ms = hidden.set_index("hook")["comm_ms"]
    assert hidden_ms["allreduce"] == pytest.approx(ms[("allreduce", 8)] / 2)  # DDP's all-reduce overlaps
    assert hidden_ms["topk"] == pytest.approx(ms[("topk", 8)])  # a hook that waits hides nothing
    fig = plots.network_time(model, 8, overlapped=hidden)
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert "allreduce, 50% hidden by overlap" in labels and not any("topk," in t for t in labels)
    with pytest.raises(ValueError, match="allreduce"):
        netmodel.network_model({"fp16": traffics["fp16"]})


def test_compression_cost_per_element_is_timed_for_every_hook():
    costs = netmodel.compression_cost_per_element(side=64, repeats=1)
    assert set(costs) == {"fp16", "power_sgd r1", "power_sgd r4", "topk 1% + EF", "sign + EF"}
    assert all(0 < c < 1e-5 for c in costs.values())


def _timed(name, step_times, config=None):
    steps = pd.DataFrame({"step": range(len(step_times)), "step_time_s": step_times})
    return lab.Result({"name": name, **(config or {})}, steps, pd.DataFrame())


def test_headroom_compares_median_step_times_after_warm_up():
    runs = [_timed("no", [9.0, 0.004, 0.004, 0.004]), _timed("noop", [9.0, 0.001, 0.001, 0.003])]
    table = netmodel.headroom(runs, skip=1)
    assert table.loc["noop", "median_step_ms"] == pytest.approx(1.0)
    assert table.loc["noop", "vs_no"] == pytest.approx(-0.75)
    with pytest.raises(ValueError, match="'no'"):
        netmodel.headroom(runs[1:])


def _losses(name, losses, seed=0, accuracy=0.5):
    steps = pd.DataFrame({"step": range(len(losses)), "loss": losses, "accuracy": [math.nan] * len(losses)})
    return lab.Result({"name": name, "seed": seed}, steps, pd.DataFrame(), final={"accuracy": accuracy})


def test_diverged_means_ending_no_better_than_the_start():
    assert studies.diverged(_losses("a", [2.3] * 10 + [0.5] * 10 + [2.4] * 10))
    assert not studies.diverged(_losses("b", [2.3] * 10 + [0.5] * 20))
    assert studies.diverged(_losses("c", [2.3] * 10 + [0.5] * 9 + [math.nan]))
    summary = studies.convergence_summary(
        [_losses("a", [2.3] * 20, 0, 0.1), _losses("a", [2.3] * 10 + [0.1] * 10, 1, 0.3)]
    )
    assert summary.loc["a", "diverged"] == "1/2" and summary.loc["a", "accuracy_mean"] == pytest.approx(0.2)
    assert summary.loc["a", "accuracy_sd"] == pytest.approx(math.sqrt(0.02))


def test_convergence_study_runs_every_hook_once_per_seed():
    lineup = ["allreduce", studies.power_sgd(1, warm_start=False)]
    results = studies.convergence_study(seeds=(0, 1), steps=4, eval_every=2, model="mlp", lineup=lineup)
    assert [(r.name, r.config["seed"]) for r in results] == [
        ("allreduce", 0), ("power_sgd r1 no warm start", 0), ("allreduce", 1), ("power_sgd r1 no warm start", 1),
    ]  # fmt: skip
    assert results[0].config["measure"] is False and all(r.steps["accuracy"].notna().sum() == 2 for r in results)
    assert results[0].final["accuracy"] != results[2].final["accuracy"]  # another seed, another run
    fig = plots.convergence_seeds(results)
    assert len(fig.axes[0].get_lines()) == 3  # two hooks and the loss at step 0
    assert [item if isinstance(item, str) else item["hook"] for item in studies.payoff_lineup()] == [
        "allreduce", "fp16", "power_sgd", "power_sgd", "power_sgd", "power_sgd", "topk", "sign",
    ]  # fmt: skip


def test_headroom_study_times_noop_against_ddps_own_allreduce():
    results = studies.headroom_study(model="mlp", steps=6, warmup_steps=2)
    assert [r.name for r in results] == ["no", "allreduce", "noop", "fp16"]
    assert results.by_name("noop").steps["payload_bytes"].sum() == 0
    assert set(netmodel.headroom(results, skip=1).index) == {"no", "allreduce", "noop", "fp16"}
