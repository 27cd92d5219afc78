"""The measuring engine against facts that hold for every correct implementation."""

import math

import _workers
import pandas as pd
import pytest

import commhooks_lab as lab
from commhooks_lab import ExperimentConfig, _compat
from commhooks_lab.engine.models import LOWRANK_TRUE_RANK, build_task
from commhooks_lab.launcher.rank_server import DEFAULT_START_METHOD

pytestmark = pytest.mark.usefixtures("no_leftover_processes")


@pytest.fixture(scope="module")
def basic(cluster):
    """The stateless hooks, 4 steps each, on one warm cluster."""
    return lab.compare(["allreduce", "fp16", "bf16", "noop", "no"], steps=4, cluster=cluster)


def powersgd(rank, start=2, **extra):
    return {"matrix_approximation_rank": rank, "start_powerSGD_iter": start, **extra}


def test_allreduce_is_exact_and_ranks_agree(basic):
    s = basic.by_name("allreduce").steps
    assert (s["rel_error"] < 1e-6).all()
    assert (s["rank_spread"] == 0).all()
    assert not s["compressing"].any()
    assert basic.by_name("allreduce").ranks_agree


def test_fp16_error_is_within_its_unit_roundoff_and_halves_the_bytes(basic):
    fp16, exact = basic.by_name("fp16").steps, basic.by_name("allreduce").steps
    assert ((fp16["rel_error"] > 0) & (fp16["rel_error"] <= 2**-11)).all()
    assert (fp16["payload_bytes"] * 2 == exact["payload_bytes"]).all()
    assert (fp16["payload_bytes"] * 2 == fp16["uncompressed_bytes"]).all()
    assert fp16["compressing"].all()
    assert (fp16["ring_bytes"] == fp16["payload_bytes"]).all()  # 2(W-1)/W = 1 for two ranks


def test_bf16_is_measured_on_every_build_and_a_refusal_is_shown_where_ddp_refuses(basic):
    """DDP's name check reads the build: a CPU build refuses bf16_compress_hook, a CUDA build (GPU or not) takes it.
    Either way the lab measures the same arithmetic, and notes the refusal only where there is one."""
    bf16 = basic.by_name("bf16")
    assert ((bf16.steps["rel_error"] > 0) & (bf16.steps["rel_error"] <= 2**-8)).all()
    assert (bf16.steps["rel_error"] > basic.by_name("fp16").steps["rel_error"]).all()
    notes = [n for n in bf16.notes if n.startswith("bf16")]
    if _compat.bf16_refusal() is None:
        assert notes == [], "this build's DDP accepts bf16_compress_hook: there is no refusal to report"
        return
    (note,) = notes
    assert "TypeError: BF16 all reduce communication hook required CUDA 11+ and NCCL 2.10+" in note
    assert "with a CUDA or ROCm build with NCCL 2.10+ (or XCCL with an XPU device present) your own" in note


def test_noop_breaks_the_ddp_invariant(basic):
    noop = basic.by_name("noop")
    assert (noop.steps["rank_spread"] > 0).all()
    assert (noop.steps["payload_bytes"] == 0).all()
    assert not noop.ranks_agree


def test_no_hook_is_measured_through_allreduce_hook(basic):
    no = basic.by_name("no")
    assert (no.steps["rel_error"] < 1e-6).all()
    assert any("allreduce_hook" in n for n in no.notes)
    assert no.final["param_digests"] == basic.by_name("allreduce").final["param_digests"]


@pytest.mark.parametrize("world_size, same", [(2, True), (3, False), (4, True)])
def test_allreduce_hook_is_the_builtin_reduction_bit_for_bit_only_at_a_power_of_two(world_size, same):
    """DDP's reducer multiplies each bucket by 1/W (``mul_out(bucket_view, grad, 1/div_factor)``); allreduce_hook
    divides by W. The two round alike when 1/W is exact, i.e. W a power of two; at W = 3 the last bits differ."""
    with lab.Cluster(world_size=world_size) as cluster:
        builtin, hook = lab.compare(["no", "allreduce"], steps=3, measure=False, world_size=world_size, cluster=cluster)
    assert builtin.ranks_agree and hook.ranks_agree
    assert (builtin.final["param_digests"] == hook.final["param_digests"]) is same


def analytic_powersgd_bytes(model: str, rank: int, min_rate: float = 2) -> int:
    """(n + m) r 4 bytes per matrix PowerSGD compresses, 4 numel for everything else."""
    total = 0
    for p in build_task(model, 0).model.parameters():
        n = p.shape[0]
        m = p.numel() // n
        r = min(n, m, rank)
        if p.dim() > 1 and (n + m) * r * min_rate < n * m:
            total += (n + m) * r * 4
        else:
            total += p.numel() * 4
    return total


@pytest.mark.parametrize("model", ["mlp", "cnn", "lowrank"])
def test_powersgd_payload_matches_the_analytic_count(cluster, model):
    results = lab.compare(
        [{"state_options": powersgd(r)} for r in (1, 2, 4)], hook="power_sgd", model=model, steps=3, cluster=cluster
    )
    for rank, result in zip((1, 2, 4), results):
        s = result.steps
        assert list(s["compressing"]) == [False, False, True]
        assert s["payload_bytes"].iloc[-1] == analytic_powersgd_bytes(model, rank)
        assert s["payload_bytes"].iloc[0] == s["uncompressed_bytes"].iloc[0]


def test_powersgd_error_falls_as_rank_rises_on_the_lowrank_task(cluster):
    ranks = (1, 2, LOWRANK_TRUE_RANK)
    results = lab.compare(
        [{"state_options": powersgd(r)} for r in ranks], hook="power_sgd", model="lowrank", steps=4, cluster=cluster
    )
    errors = [r.steps["rel_error"].iloc[-1] for r in results]
    assert errors[0] > errors[1] > errors[2]
    assert errors[2] < 1e-4  # at the true rank one power iteration recovers the matrix


def test_compressing_is_false_before_start_powerSGD_iter(cluster):
    result = lab.run(hook="power_sgd", state_options=powersgd(1, start=3), steps=5, cluster=cluster)
    assert list(result.steps["compressing"]) == [False, False, False, True, True]
    assert (result.steps["rel_error"].iloc[:3] < 1e-6).all()


def test_powersgd_that_never_compresses_says_why(cluster):
    result = lab.run(hook="power_sgd", steps=3, cluster=cluster)
    (note,) = [n for n in result.notes if "never compressed" in n]
    assert "start_powerSGD_iter=1000 (PyTorch's default) >= steps=3" in note
    assert "comm_state_option" in note


def test_powersgd_blocked_by_min_compression_rate_says_so(cluster):
    result = lab.run(hook="power_sgd", state_options=powersgd(1, min_compression_rate=1000), steps=3, cluster=cluster)
    (note,) = [n for n in result.notes if "never compressed" in n]
    assert "min_compression_rate=1000" in note and "Lower min_compression_rate" in note


def test_batched_powersgd_runs_with_the_fix_and_says_so(cluster):
    result = lab.run(hook="batched_power_sgd", state_options=powersgd(2), steps=3, cluster=cluster)
    assert result.steps["compressing"].iloc[-1]
    assert 0 < result.steps["rel_error"].iloc[-1] < math.inf
    assert any("batched_powerSGD_hook hands a 2-D matrix to _orthogonalize" in n for n in result.notes)


@pytest.mark.parametrize(
    "hook, options",
    [
        ("no", {}),
        ("allreduce", {}),
        ("fp16", {}),
        ("power_sgd", powersgd(1)),
        ("batched_power_sgd", powersgd(2)),
    ],
)
def test_the_probe_never_changes_the_trained_parameters(cluster, hook, options):
    """Against a plain DDP loop with no lab code in it (tests/_workers.plain_ddp_digest), not just measure=False."""
    config = ExperimentConfig(hook=hook, state_options=options, steps=4)
    on, off = (lab.run(config, measure=m, cluster=cluster) for m in (True, False))
    (plain, _) = cluster.run(_workers.plain_ddp_digest, hook, options, 4)
    assert on.final["param_digests"] == off.final["param_digests"] == [plain, plain]
    assert "rel_error" in on.steps and "rel_error" not in off.steps


def test_same_seed_gives_bit_identical_numbers(cluster):
    config = ExperimentConfig(hook="power_sgd", state_options=powersgd(2), steps=4)
    first, second = lab.run(config, cluster=cluster), lab.run(config, cluster=cluster)
    pd.testing.assert_frame_equal(
        first.steps.drop(columns="step_time_s"), second.steps.drop(columns="step_time_s"), check_exact=True
    )
    pd.testing.assert_frame_equal(first.layers, second.layers, check_exact=True)
    other = lab.run(config.replace(seed=1), cluster=cluster)
    assert other.final["param_digests"] != first.final["param_digests"]


def test_a_multi_bucket_model_runs_powersgd_safely_on_gloo(cluster):
    result = lab.run(
        hook="power_sgd", state_options=powersgd(1), model="cnn", bucket_cap_mb=0.01, steps=3, cluster=cluster
    )
    assert result.steps["buckets"].iloc[-1] > 1
    last = result.layers[result.layers["step"] == 2]
    assert last["bucket"].nunique() == result.steps["buckets"].iloc[-1]  # per-bucket view of the layers
    assert result.env["start_method"] == cluster.spec.start_method == DEFAULT_START_METHOD  # the rank server on Linux
    assert result.ranks_agree and result.steps["compressing"].iloc[-1]


def test_user_hooks_run_as_callables_and_by_name(cluster):
    for hook in (_workers.my_allreduce_hook, "_workers:my_allreduce_hook"):
        result = lab.run(hook=hook, steps=3, cluster=cluster)
        assert (result.steps["rel_error"] < 1e-6).all()
        assert result.name == "my_allreduce_hook"


def test_wrappers_and_accelerate_enum_members_are_accepted(cluster):
    accelerate = pytest.importorskip("accelerate.utils")
    kind = accelerate.DDPCommunicationHookType
    result = lab.run(hook=kind.POWER_SGD, wrapper=kind.FP16, state_options=powersgd(1), steps=3, cluster=cluster)
    assert result.name == "fp16_wrapper(power_sgd r1)"
    plain = lab.run(hook="power_sgd", state_options=powersgd(1), steps=3, cluster=cluster)
    assert result.steps["payload_bytes"].iloc[-1] * 2 == plain.steps["payload_bytes"].iloc[-1]


def test_a_cluster_of_another_size_is_refused(cluster):
    with pytest.raises(ValueError, match="world_size=3"):
        lab.run(world_size=3, cluster=cluster)


def test_save_and_load_round_trip_exactly(basic, tmp_path):
    original = basic.by_name("bf16")
    loaded = lab.load(original.save(tmp_path / "bf16.json"))
    pd.testing.assert_frame_equal(loaded.steps, original.steps, check_exact=True)
    pd.testing.assert_frame_equal(loaded.layers, original.layers, check_exact=True)
    assert (loaded.config, loaded.notes, loaded.env, loaded.final, loaded.sample) == (
        original.config,
        original.notes,
        original.env,
        original.final,
        original.sample,
    )
    folder = basic.save(tmp_path / "all")
    assert [r.name for r in lab.load(tmp_path / "all")] == [r.name for r in basic] and len(folder) == 5


def test_load_refuses_other_files(tmp_path):
    path = tmp_path / "x.json"
    path.write_text('{"format": "something else"}')
    with pytest.raises(ValueError, match="not a saved commhooks_lab Result"):
        lab.load(path)


def test_available_hooks_says_what_runs_here_and_why_not():
    table = lab.available_hooks()
    hooks = table[table["kind"] == "hook"].set_index("name")
    pytorch_s = ["no", "allreduce", "fp16", "bf16", "power_sgd", "batched_power_sgd", "noop"]
    lab_s = ["ring16", "wire16_sum32", "local_sgd", "post_local_sgd", "diloco"]
    lab_s += ["hierarchical", "hierarchical_fp16", "hierarchical_power_sgd", "hierarchical_topk"]
    assert list(hooks.index) == pytorch_s + lab_s  # PyTorch's, then the lab's own
    assert hooks["runs_here"].all()
    # the notes quote what trying each one on this machine raised, not a typed guess
    refusal = _compat.bf16_refusal()  # DDP's name check reads the build
    if refusal is None:
        assert "refuses" not in hooks.loc["bf16", "note"]
    else:
        assert "TypeError: BF16 all reduce communication hook required CUDA 11+" in hooks.loc["bf16", "note"]
    assert "AssertionError" in hooks.loc["batched_power_sgd", "note"]
    compressors = table[table["kind"] == "compressor"]["name"].tolist()
    assert compressors == ["topk", "randomk", "sign", "qsgd", "terngrad", "int8"]
    other = table[table["kind"] == "pytorch (not in the lab)"].set_index("name")
    assert "IndexError: invalid index of a 0-dim tensor" in other.loc["quantization_pertensor_hook", "note"]
    assert "list of 1 Tensor" in other.loc["quantization_pertensor_hook", "note"]  # gloo's all_gather layout
    # torch 2.13 says "CUDA", 2.14 "CUDA/XPU": the lab words it the same way for both
    lab_words = "ValueError (in the lab's words): new_subgroups() without group_size makes"
    assert other.loc["post_localSGD_hook", "note"].startswith(lab_words)
    assert not other.loc[["quantization_pertensor_hook", "post_localSGD_hook"], "runs_here"].any()
