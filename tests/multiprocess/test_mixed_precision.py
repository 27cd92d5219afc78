"""Notebook 10's mixed-precision section on real ranks: autocast's dtypes, GradScaler after the fp16 hook, clipping
after the hook, and the float16 PowerSGD replay against real ranks at 2, 3 and 4."""

import pandas as pd
import pytest
import torch

from commhooks_lab.studies import mixed_precision as amp

pytestmark = pytest.mark.usefixtures("no_leftover_processes")

SCALES = tuple(range(16, 22))  # around every stage's limit on the digits MLP (2^17 to 2^20)


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_the_float16_powersgd_replay_is_what_real_ranks_do(world_size):
    """Every stage's finiteness at every scale, PyTorch's own fp16_compress_wrapper(powerSGD_hook) on real ranks."""
    real = amp.powersgd_fp16_real(world_size, SCALES)
    assert real[0]["bucket_shapes"] == [(128, 64), (128,), (10, 128), (10,)]  # the replay's bucket order
    measured = pd.DataFrame(real).drop(columns="bucket_shapes")
    replayed = pd.DataFrame(amp.powersgd_fp16_replay(world_size, SCALES))
    pd.testing.assert_frame_equal(measured, replayed)
    assert not replayed[list(amp.STAGES)].all().all(), "the scales must reach an overflow, or this checks nothing"
    assert replayed[list(amp.STAGES)].any().all(), "the scales must include a finite step"


def test_the_powersgd_limits_fall_with_the_world_size_where_the_cast_does_not():
    limits = amp.powersgd_fp16_limits(world_sizes=(2, 8))
    assert limits.loc[2, "p_norm"] == limits.loc[2, "cast"]
    assert limits.loc[8, "p_norm"] < limits.loc[8, "cast"]
    assert limits.loc[8, "output"] < limits.loc[2, "output"]


def test_a_float16_sum_that_overflows_is_caught():
    """The stages see an overflow in P's sum alone: two ranks' P that are finite and sum past 65520."""
    ones = [torch.ones(4, 1) * 0.5]  # one compressed 4x1 matrix per rank, scaled below
    flags = amp._stages([ones, ones], 2.0**17, [torch.ones(1, 1, 1, dtype=torch.float16)], [0])
    assert float((ones[0] * 2.0**17).max()) > 65520  # the cast itself overflows here
    assert not flags["cast"] and not flags["output"]
    flags = amp._stages([ones, ones], 2.0**16, [torch.ones(1, 1, 1, dtype=torch.float16)], [0])
    assert flags["cast"] and flags["p_local"] and not flags["p_sum"]  # 32768 + 32768 rounds to infinity


def test_autocast_hands_the_hook_float32_holding_16_bit_values(cluster):
    table = amp.autocast_table(("float32", "bfloat16"), ("allreduce", "bf16"), world_size=2, cluster=cluster)
    assert set(table["dtype_in_hook"]) == {"float32"} and set(table["parameter_dtype"]) == {"float32"}
    under = table[table["autocast"] == "bfloat16"]
    assert (under["bf16_exact"] == 1.0).all()
    assert (table.loc[table["autocast"] == "float32", "bf16_exact"] < 0.9).all()
    assert (table.loc[table["hook"] == "bf16", "rel_error"] > 1e-4).all()  # the hook still rounds the sums


def test_the_scaler_skips_exactly_where_the_fp16_hook_overflows_and_ranks_clip_alike():
    table = amp.scaler_table(("allreduce", "fp16"), ("float32",), steps=6, world_size=3)
    plain, fp16 = (table[table["hook"] == h] for h in ("allreduce", "fp16"))
    assert not plain["skipped"].any()
    assert fp16["skipped"].any()
    assert (fp16["skipped"] == (fp16["largest_scaled_grad"] >= amp.FP16_OVERFLOW)).all()
    after_skip = fp16["scale"].to_numpy()
    for step in fp16.loc[fp16["skipped"], "step"]:
        if step + 1 < len(after_skip):
            assert after_skip[step + 1] == after_skip[step] / 2
    assert table["ranks_agree_on_norm"].all() and table["ranks_agree_on_grads"].all()
