"""The course's claims about DDP in general, at three ranks: a claim checked only at W = 2, a power of two, can
hold there by accident (allreduce_hook and the C++ reducer agree bit for bit at W = 2 and 4, not at 3)."""

import pytest
from test_engine import analytic_powersgd_bytes

import commhooks_lab as lab

pytestmark = pytest.mark.usefixtures("no_leftover_processes")

W = 3


@pytest.fixture(scope="module")
def three():
    with lab.Cluster(world_size=W) as cluster:
        yield cluster


def test_an_exact_hook_keeps_ranks_identical_and_fp16_sends_half(three):
    """Notebook 1: the ranks agree after every step, fp16 hands half the bytes to the collective."""
    fp32, fp16 = lab.compare(["allreduce", "fp16"], steps=3, world_size=W, cluster=three)
    assert fp32.ranks_agree and fp16.ranks_agree
    assert (fp16.steps["payload_bytes"] * 2 == fp32.steps["payload_bytes"]).all()
    assert (fp32.steps["rel_error"] < 1e-6).all()


def test_powersgd_sends_its_analytic_bytes(three):
    """Notebook 4: (n + m) r float32s per compressed matrix, whatever W."""
    state = {"matrix_approximation_rank": 2, "start_powerSGD_iter": 2}
    run = lab.run(hook="power_sgd", state_options=state, steps=3, world_size=W, cluster=three)
    assert run.steps["payload_bytes"].iloc[-1] == analytic_powersgd_bytes("mlp", 2)


def test_local_sgd_sends_one_h_th_of_ddps_bytes_and_diloco_at_h_1_is_ddp(three):
    """Notebook 11: exactly 1/H of the bytes; DiLoCo with H = 1, plain SGD and a plain outer step is DDP."""
    ddp, local = lab.compare(["allreduce", "local_sgd[sync_every=4]"], steps=8, world_size=W, cluster=three)
    assert local.steps["payload_bytes"].sum() * 4 == ddp.steps["payload_bytes"].sum()
    common = dict(steps=4, optimizer="sgd", measure=False, world_size=W, cluster=three)
    plain = lab.run(hook="allreduce", **common)
    diloco = lab.run(hook="diloco[sync_every=1,outer_lr=1.0,outer_momentum=0.0]", **common)
    for a, b in zip(plain.steps["loss"], diloco.steps["loss"]):
        assert abs(a - b) <= 1e-6 * abs(a)


def test_accelerate_registers_the_hook_plain_pytorch_would(three):
    """Notebook 5: the same parameters bit for bit through either API."""
    pytest.importorskip("accelerate")
    state = {"matrix_approximation_rank": 1, "start_powerSGD_iter": 2}
    runs = [lab.run(hook="power_sgd", state_options=state, steps=4, api=api, world_size=W, cluster=three)
            for api in ("torch", "accelerate")]  # fmt: skip
    assert runs[0].final["param_digests"] == runs[1].final["param_digests"]
