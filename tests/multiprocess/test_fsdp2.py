"""FSDP2 measured like DDP: reduce_dtype chosen by the DDP hook name, the same metrics, the bytes per collective."""

import pytest
import torch

import commhooks_lab as lab

pytestmark = pytest.mark.usefixtures("no_leftover_processes")

MLP_PARAMETERS = 9610


@pytest.fixture(scope="module")
def side_by_side():
    with lab.Cluster(world_size=2) as cluster:
        ddp = lab.compare(["allreduce", "fp16", "bf16"], steps=3, cluster=cluster)
        fsdp2 = lab.compare(["allreduce", "fp16", "bf16"], api="fsdp2", steps=3, cluster=cluster)
    return ddp, fsdp2


def test_fsdp2_bf16_error_is_within_one_bf16_rounding_scale(side_by_side):
    _, fsdp2 = side_by_side
    bf16 = fsdp2.by_name("bf16").steps["rel_error"]
    assert ((bf16 > 0) & (bf16 <= 2**-7)).all()  # the (0, 2^-7]
    assert (fsdp2.by_name("allreduce").steps["rel_error"] < 1e-6).all()
    assert all(r.ranks_agree for r in fsdp2)


def test_at_two_ranks_fsdp2_reduces_like_ddps_hooks(side_by_side):
    """Two addends round the same way in any order: FSDP2's reduce_dtype error equals DDP's hook error."""
    ddp, fsdp2 = side_by_side
    for name in ("fp16", "bf16"):
        assert list(fsdp2.by_name(name).steps["rel_error"]) == pytest.approx(list(ddp.by_name(name).steps["rel_error"]))


def test_fsdp2_moves_other_bytes_than_ddp_and_says_why(side_by_side):
    ddp, fsdp2 = side_by_side
    d, f = ddp.by_name("fp16").steps, fsdp2.by_name("fp16").steps
    assert (d["payload_bytes"] == MLP_PARAMETERS * 2).all()  # one fp16 all-reduce of every gradient
    # backward: a float16 reduce-scatter of every gradient, and the float32 parameters re-gathered (1/W each)
    assert (f["reduce_scatter_single_bytes"] == MLP_PARAMETERS * 2).all()
    assert (f["all_gather_single_bytes"] == MLP_PARAMETERS * 4 // 2).all()
    assert any("reduce-scattered" in n for n in fsdp2.by_name("fp16").notes)


def test_the_fsdp2_hooks_and_their_dtypes_come_from_the_registry():
    from commhooks_lab.engine.config import fsdp2_hooks
    from commhooks_lab.engine.fsdp2 import reduce_dtype

    assert fsdp2_hooks() == ["allreduce", "fp16", "bf16"]
    dtypes = [reduce_dtype(lab.ExperimentConfig(api="fsdp2", hook=name).check()) for name in fsdp2_hooks()]
    assert dtypes == [torch.float32, torch.float16, torch.bfloat16]
    with pytest.raises(ValueError, match="names a reduce_dtype"):
        reduce_dtype(lab.ExperimentConfig(hook="power_sgd").check())


def test_fsdp2_refuses_what_it_cannot_do():
    with pytest.raises(ValueError, match="api='fsdp2' takes hook in"):
        lab.ExperimentConfig(api="fsdp2", hook="power_sgd", state_options={"start_powerSGD_iter": 2}).check()
    with pytest.raises(ValueError, match="api='fsdp2'"):
        lab.ExperimentConfig(api="fsdp2", hook="fp16", wrapper="bf16").check()
