"""The course's claims about DDP in general, at three ranks: a claim checked only at W = 2, a power of two, can
hold there by accident (allreduce_hook and the C++ reducer agree bit for bit at W = 2 and 4, not at 3)."""

import pytest
import torch
from test_engine import analytic_powersgd_bytes

import commhooks_lab as lab
from commhooks_lab.studies import precision

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
    """Notebook 12: exactly 1/H of the bytes; DiLoCo with H = 1, plain SGD and a plain outer step is DDP."""
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


def test_the_ring_on_three_real_ranks_is_notebook_10s_replay(three):
    """Notebook 10: real ranks round as the replay does, in float16 too, so the replay's bound checks are theirs."""
    grads = precision.local_gradients("mlp", W)
    exact = grads.double().mean(dim=0)
    dtypes = (torch.bfloat16, torch.float16)
    runs = lab.compare([{"hook": "ring16", "state_options": {"dtype": str(d).replace("torch.", "")}} for d in dtypes],
                       steps=1, world_size=W, cluster=three)  # fmt: skip
    for dtype, run in zip(dtypes, runs):
        replay = precision.rel_error(precision.reduce_16bit(grads, dtype, "ring"), exact)
        assert run.steps["rel_error"].iloc[0] == pytest.approx(replay, rel=1e-9), dtype
        assert run.ranks_agree


@pytest.mark.parametrize("world", [W, 4])
def test_the_rings_error_is_within_its_bound_where_the_bounds_condition_holds(world):
    """Notebook 10: |h - mean| <= gamma_(W+1) sum|g_r|/W per element while no rounded value is subnormal; float16
    breaks the condition on these gradients (and the plain bound on some elements), the underflow term repairs it."""
    grads = precision.local_gradients("mlp", world)
    bf16, fp16 = (precision.ring_bound_check(grads, d) for d in (torch.bfloat16, torch.float16))
    for check in (bf16, fp16):
        assert check["overflow"] == 0
        assert check["over_bound_where_it_holds"] == 0 and check["over_bound_with_underflow"] == 0
    # bfloat16 has float32's exponent range: the condition holds everywhere, so the norm-wise bound is a bound
    assert bf16["subnormal"] == 0 and bf16["over_bound"] == 0
    ring = precision.rel_error(precision.reduce_16bit(grads, torch.bfloat16, "ring"), grads.double().mean(dim=0))
    assert ring <= precision._worst_case_bound(grads, torch.bfloat16)
    assert fp16["subnormal"] > 0 and fp16["over_bound"] > 0


@pytest.mark.parametrize("world", [2, 3, 4])
def test_the_fix_sends_the_hooks_16bit_values_only_when_w_is_a_power_of_two(world):
    """Notebook 10: fl(g/W) (the fix: divide in float32, then cast) is fl(fl(g)/W) (the hook: cast, then divide)
    when W is a power of two and the quotient is normal; at W = 3 dividing rounds twice and some values differ."""
    grads = precision.local_gradients("mlp", world)
    for dtype in (torch.bfloat16, torch.float16):
        fix, hook = (grads / world).to(dtype), grads.to(dtype) / world
        differ = fix != hook
        if world == 3:
            assert differ.any()
        else:
            assert not (differ & (hook.abs() >= torch.finfo(dtype).tiny)).any()


def _flat_against_per_parameter(ctx):
    """All-reduce the 64-32-10 MLP's gradient shapes once as one flat bucket (eager DDP) and once per parameter
    (DDP under compiled autograd); return how many elements differ."""
    import torch.distributed as dist

    generator = torch.Generator().manual_seed(ctx.rank)
    grads = [torch.randn(shape, generator=generator) for shape in ((32, 64), (32,), (10, 32), (10,))]
    flat = torch.cat([g.flatten() for g in grads])
    dist.all_reduce(flat)
    for g in grads:
        dist.all_reduce(g)
    return int((flat != torch.cat([g.flatten() for g in grads])).sum())


def test_compiled_autograds_per_parameter_all_reduce_matches_one_bucket_only_at_two_ranks(three, cluster):
    """Notebook 11: one all-reduce per gradient sums as one flat bucket does at W = 2 (a + b = b + a); at W = 3
    gloo's order of summation depends on an element's place in the tensor, so some elements differ in the last bit."""
    assert cluster.run(_flat_against_per_parameter) == [0, 0]
    differ = three.run(_flat_against_per_parameter)
    assert differ[0] > 0 and len(set(differ)) == 1
