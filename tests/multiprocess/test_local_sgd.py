"""Communicating every H steps: local SGD, post-local SGD and DiLoCo as registered families, and DiLoCo's outer step
against torchft's on the same inputs."""

import pytest
import torch

import commhooks_lab as lab
from commhooks_lab import cli
from commhooks_lab.hooks import registry
from commhooks_lab.studies import low_communication

pytestmark = pytest.mark.usefixtures("no_leftover_processes")

STEPS = 8


@pytest.fixture(scope="module")
def runs(cluster):
    items = ["allreduce", "local_sgd[sync_every=2]", "local_sgd[sync_every=4]", "diloco[sync_every=4]",
             "diloco[sync_every=4,compress=bf16]", "post_local_sgd[sync_every=4,start_localSGD_iter=2]"]  # fmt: skip
    return lab.compare(items, steps=STEPS, cluster=cluster)


@pytest.mark.parametrize("name, every", [("local_sgd H=2", 2), ("local_sgd H=4", 4), ("diloco H=4", 4)])
def test_an_uncompressed_sync_every_h_steps_sends_exactly_one_h_th_of_ddps_bytes(runs, name, every):
    ddp, run = runs.by_name("allreduce").steps, runs.by_name(name).steps
    assert run["payload_bytes"].sum() * every == ddp["payload_bytes"].sum()
    assert run["ring_bytes"].sum() * every == ddp["ring_bytes"].sum()
    synced = run["synced"].astype(bool)
    assert synced.tolist() == [(s + 1) % every == 0 for s in range(STEPS)]
    assert (run.loc[~synced, "payload_bytes"] == 0).all()  # between syncs DDP's hook sends nothing


def test_ranks_drift_apart_between_syncs_and_agree_after_one(runs, cluster):
    run = runs.by_name("local_sgd H=4").steps
    assert (run["rank_spread"] > 0).all()  # each rank's own gradient, by design
    assert runs.by_name("local_sgd H=4").ranks_agree  # 8 steps: the last one synchronised
    odd = lab.run(hook="local_sgd[sync_every=3]", steps=STEPS, measure=False, cluster=cluster)
    assert not odd.ranks_agree  # steps 6 and 7 ran alone after the sync at step 5


def test_diloco_reports_the_outer_update_error_and_compression_halves_its_bytes(runs):
    full, half = runs.by_name("diloco H=4").steps, runs.by_name("diloco H=4 bf16").steps
    assert half["payload_bytes"].sum() * 2 == full["payload_bytes"].sum()  # the exact reference is not counted
    assert full["outer_rel_error"].dropna().max() < 1e-6  # float32 rounding of the sum
    assert (half["outer_rel_error"].dropna().between(1e-5, 2**-7)).all()  # bf16: u = 2^-8, two roundings


def test_diloco_without_measuring_trains_the_same_and_reports_no_outer_error(runs, cluster):
    measured = runs.by_name("diloco H=4").steps
    run = lab.run(hook="diloco[sync_every=4]", steps=STEPS, measure=False, cluster=cluster).steps
    assert run["loss"].tolist() == measured["loss"].tolist()  # the reference never touches the parameters
    assert run["payload_bytes"].tolist() == measured["payload_bytes"].tolist()
    synced = run["synced"].astype(bool)
    assert run.loc[synced, "outer_rel_error"].isna().all() and measured.loc[synced, "outer_rel_error"].notna().all()


@pytest.mark.parametrize("measure", [False, True])
def test_a_diloco_sync_sends_its_float64_reference_only_when_the_run_measures(monkeypatch, measure):
    """In one process, with the collectives recorded: measure=False, one float32 all-reduce per sync (the
    reference's float64 all-reduce doubled a sync's traffic inside the timed step); measure=True adds it."""
    import contextlib
    import types

    import torch.distributed as dist

    from commhooks_lab.hooks.local_sgd import DiLoCo
    from commhooks_lab.measure.probe import Probe

    sent = []
    monkeypatch.setattr(dist, "all_reduce", lambda tensor, *args, **kwargs: sent.append(tensor.dtype))
    monkeypatch.setattr(dist, "get_world_size", lambda *args, **kwargs: 1)
    probe = object.__new__(Probe)  # only what count_into hands the sync: its bound _uncounted
    probe.measure_enabled, probe.counter = measure, types.SimpleNamespace(active=True)
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    diloco = DiLoCo(model, optimizer, {"sync_every": 2, "outer_lr": 0.7, "outer_momentum": 0.9, "compress": "none"})
    assert diloco.after_step(0, probe._uncounted) == {"synced": False} and sent == []
    with torch.no_grad():
        model.weight.add_(0.5)  # an inner step's worth of movement
    extra = diloco.after_step(1, probe._uncounted)
    assert sent == ([torch.float64, torch.float32] if measure else [torch.float32])
    assert extra["synced"]
    if measure:
        assert extra["outer_rel_error"] == 0.0  # one rank: the float32 mean is the exact one
    else:
        assert extra["outer_rel_error"] != extra["outer_rel_error"]  # NaN: not measured
    sent.clear()
    diloco.after_step(3, contextlib.nullcontext)  # outside a probe (torchft_parity): it measures
    assert sent == [torch.float64, torch.float32]


@pytest.mark.parametrize("compress, rule", [("topk", ("topk", {"ratio": 0.01})), ("int8", ("int8", {}))])
def test_diloco_through_the_lab_compressors_sends_what_their_byte_rules_say(cluster, compress, rule):
    run = lab.run(hook=f"diloco[sync_every=4,compress={compress}]", steps=STEPS, cluster=cluster)
    shapes = lab.network.parameter_shapes(lab.models.build_task("mlp", 0).model)
    per_sync = lab.network.payload(lab.network.rule_traffic(shapes, rule[0], **rule[1]))
    synced = run.steps[run.steps["synced"].astype(bool)]
    assert (synced["payload_bytes"] == per_sync).all() and len(synced) == STEPS // 4
    assert (synced["outer_rel_error"] > 0).all() and (synced["outer_rel_error"] < 1.5).all()
    assert run.name == f"diloco H=4 {compress}"


def test_post_local_sgd_reduces_globally_in_the_warm_up_then_averages_every_period(runs):
    run, ddp = runs.by_name("post_local_sgd H=4").steps, runs.by_name("allreduce").steps
    per_step = ddp["ring_bytes"].iloc[0]
    # steps 0 and 1: the hook's global all-reduce; from step 2, subgroups of one rank (nothing leaves the rank)
    # and PeriodicModelAverager's average at steps 2 and 6 (warm-up 2, period 4)
    assert run["ring_bytes"].tolist() == [per_step, per_step, per_step, 0, 0, 0, per_step, 0]
    assert run["synced"].astype(bool).tolist() == [False, False, True, False, False, False, True, False]


def test_diloco_with_one_inner_step_and_a_plain_outer_step_is_ddp(cluster):
    """H=1, inner SGD without momentum, outer SGD at lr 1 without momentum: θ - mean(η g) = DDP's θ - η mean(g)."""
    common = dict(steps=6, optimizer="sgd", measure=False, cluster=cluster)
    ddp = lab.run(hook="allreduce", **common)
    diloco = lab.run(hook="diloco[sync_every=1,outer_lr=1.0,outer_momentum=0.0]", **common)
    # not bit for bit: the pseudo-gradient θ - (θ - η g) rounds once more than η g
    torch.testing.assert_close(
        torch.tensor(diloco.steps["loss"].tolist()), torch.tensor(ddp.steps["loss"].tolist()), rtol=1e-6, atol=0
    )


def test_the_families_are_registered_like_every_hook():
    table = lab.available_hooks().set_index("name")
    for name in ("local_sgd", "post_local_sgd", "diloco"):
        assert table.loc[name, "runs_here"], table.loc[name, "note"]
    args = cli.build_parser().parse_args(["compare", "--hooks", "diloco[sync_every=8,compress=fp16]"])
    (config,) = cli.comparison_configs(args)
    assert config.hook == "diloco" and config.state_options == {"sync_every": 8, "compress": "fp16"}
    assert registry.get("diloco").run_name({"sync_every": 8, "compress": "fp16"}) == "diloco H=8 fp16"
    for bad, text in [
        ({"sync_every": 0}, "sync_every must be an int >= 1"),
        ({"compress": "int4"}, "compress must be one of"),
        ({"outer_momentum": 1.0}, "outer_momentum must be in"),
    ]:
        with pytest.raises(ValueError, match=text):
            lab.ExperimentConfig(hook="diloco", state_options=bad).check()
    with pytest.raises(ValueError, match="outer state"):
        lab.ExperimentConfig(hook="local_sgd", checkpoint_at=2, checkpoint_dir="/nonexistent").check()
    with pytest.raises(ValueError, match="cannot run under compiled autograd"):
        lab.ExperimentConfig(hook="diloco", compile="compiled_autograd", measure=False).check()


def test_the_lab_outer_step_equals_torchfts_on_the_same_inputs(cluster):
    pytest.importorskip("torchft", reason="torchft is a test dependency (pip install -e '.[test]')")
    differences = low_communication.torchft_parity(cluster, steps=8, every=4)
    assert differences == [[0.0] * 4, [0.0] * 4]  # two outer steps, bit for bit on both ranks


def test_warm_runs_of_post_local_sgd_leave_no_process_groups_behind(cluster):
    """Its subgroups of one rank are made once per process group: a group per run added fds and threads to every
    warm rank, 50 runs took each from 18 to 218 fds."""
    import psutil

    def footprint() -> list[tuple[int, int]]:
        return [(psutil.Process(pid).num_fds(), psutil.Process(pid).num_threads()) for pid in cluster.pids]

    spec = "post_local_sgd[sync_every=2,start_localSGD_iter=1]"
    lab.run(hook=spec, steps=2, measure=False, cluster=cluster)
    before = footprint()
    for _ in range(4):
        lab.run(hook=spec, steps=2, measure=False, cluster=cluster)
    assert footprint() == before
