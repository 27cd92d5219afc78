"""The Accelerate form of each hook does exactly what the plain PyTorch form does."""

import pytest

import commhooks_lab as lab
from commhooks_lab import _compat

pytest.importorskip("accelerate")
pytestmark = pytest.mark.usefixtures("no_leftover_processes")

START = {"start_powerSGD_iter": 2}
# Accelerate's own comm-hook test list, with PowerSGD made to compress within the run.
ACCELERATE_CASES = {
    "NO": ("no", "no", {}),
    "FP16": ("fp16", "no", {}),
    "BF16": ("bf16", "no", {}),
    "POWER_SGD": ("power_sgd", "no", START),
    "POWER_SGD+FP16": ("power_sgd", "fp16", START),
    "POWER_SGD+BF16": ("power_sgd", "bf16", START),
    "POWER_SGD rank 2": ("power_sgd", "no", {**START, "matrix_approximation_rank": 2}),
    "BATCHED_POWER_SGD": ("batched_power_sgd", "no", START),
    "BATCHED+FP16": ("batched_power_sgd", "fp16", START),
    "BATCHED+BF16": ("batched_power_sgd", "bf16", START),
}


@pytest.mark.parametrize("case", list(ACCELERATE_CASES))
def test_accelerate_and_plain_pytorch_train_bit_identical_parameters(cluster, case):
    hook, wrapper, options = ACCELERATE_CASES[case]
    torch_run, accel_run = (
        lab.run(hook=hook, wrapper=wrapper, state_options=options, steps=4, api=api, cluster=cluster)
        for api in ("torch", "accelerate")
    )
    assert accel_run.final["param_digests"] == torch_run.final["param_digests"]
    assert accel_run.ranks_agree
    assert list(accel_run.steps["payload_bytes"]) == list(torch_run.steps["payload_bytes"])
    assert list(accel_run.steps["rel_error"]) == list(torch_run.steps["rel_error"])
    if "power_sgd" in hook:
        assert accel_run.steps["compressing"].iloc[-1]
    assert accel_run.notes == torch_run.notes  # the same refusals and fixes are reported for both


def test_bf16_refusal_is_the_one_accelerate_would_meet(cluster):
    """Where this build's DDP refuses the bf16 wrapper by name, the note quotes it; where it accepts it, none."""
    result = lab.run(hook="power_sgd", wrapper="bf16", state_options=START, steps=3, api="accelerate", cluster=cluster)
    if _compat.bf16_refusal() is None:
        assert result.notes == [] and result.steps["compressing"].iloc[-1]
        return
    (note,) = result.notes
    assert "bf16_compress_wrapper_hook" in note and "TypeError: BF16 all reduce communication hook" in note


def test_accelerate_default_start_iter_never_compresses_and_says_so(cluster):
    result = lab.run(hook="power_sgd", steps=3, api="accelerate", cluster=cluster)
    assert not result.steps["compressing"].any()
    (note,) = [n for n in result.notes if "never compressed" in n]
    assert "comm_state_option" in note and "start_powerSGD_iter=1000" in note


@pytest.mark.parametrize("hook, text", [("allreduce", "no Accelerate form"), ("noop", "no Accelerate form")])
def test_hooks_without_an_accelerate_form_are_refused(hook, text):
    with pytest.raises(ValueError, match=text):
        lab.run(hook=hook, api="accelerate")


@pytest.mark.parametrize("api", ["torch", "accelerate"])
def test_a_wrapper_without_a_hook_is_refused_with_a_fix_that_api_accepts(api):
    with pytest.raises(ValueError, match="Accelerate silently ignores such a comm_wrapper") as refused:
        lab.run(hook="no", wrapper="fp16", api=api)
    suggested = [name for name in ("allreduce", "power_sgd") if f"'{name}'" in str(refused.value)]
    assert suggested == (["power_sgd"] if api == "accelerate" else ["allreduce", "power_sgd"])
    for name in suggested:  # each suggestion is one the api then accepts
        lab.ExperimentConfig(hook=name, wrapper="fp16", api=api, state_options={"start_powerSGD_iter": 2}
                             if name == "power_sgd" else {}).check()  # fmt: skip
