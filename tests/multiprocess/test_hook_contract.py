"""A hook is checked where it breaks DDP's contract: before any process starts for its signature, and
on its first bucket for what it returns, each time with one sentence naming the hook."""

import _bad_hooks
import psutil
import pytest
import torch
import torch.distributed as dist

import commhooks_lab as lab

pytestmark = pytest.mark.usefixtures("no_leftover_processes")


@pytest.mark.parametrize(
    "hook, says",
    [
        (_bad_hooks.returns_the_tensor, "returned a Tensor of 9610 float32 elements, not a torch.futures.Future"),
        (_bad_hooks.callback_returns_nothing, "holding None, but it must hold one tensor of 9610 float32 elements"),
        (_bad_hooks.returns_half_the_bucket, "holding a Tensor of 4805 float32 elements, but it must hold one tensor"),
        (_bad_hooks.returns_the_raw_future, "holding a list of 1 (a Tensor of 9610 float32 elements)"),
        (_bad_hooks.returns_float16, "holding a Tensor of 9610 float16 elements, but it must hold one tensor"),
    ],
)
def test_a_hook_that_breaks_the_return_contract_is_named_with_what_it_returned(hook, says):
    check_refused(hook, says, measure=True)


def test_the_return_contract_is_checked_with_measure_off_too():
    check_refused(_bad_hooks.returns_the_tensor, "not a torch.futures.Future", measure=False)


def check_refused(hook, says, measure):
    """One-shot runs: a failed run ends its ranks, so a warm cluster would only restart each time."""
    with pytest.raises(lab.WorkerError) as caught:
        lab.run(hook=hook, steps=1, measure=measure)
    text = str(caught.value)
    assert f"the communication hook {hook.__name__} returned" in text and says in text
    for pytorchs_own in ("has no attribute 'wait'", "Expected a proper Tensor", "INTERNAL ASSERT"):
        assert pytorchs_own not in text


def test_a_correct_hook_passes_the_contract_checks():
    result = lab.run(hook=_bad_hooks_free_allreduce, steps=2)
    assert (result.steps["rel_error"] < 1e-6).all() and result.ranks_agree


def _bad_hooks_free_allreduce(state, bucket):  # sent by value: defined here, not importable in ranks by name
    tensor = bucket.buffer().div_(dist.get_world_size())
    return dist.all_reduce(tensor, async_op=True).get_future().then(lambda fut: fut.value()[0])


# -- checked as DDP checks them, before any process starts ----------------------------------------


def misnamed(state, b):
    return b


def three_parameters(state, bucket, extra):
    return bucket


def returns_a_tensor_by_annotation(state, bucket) -> torch.Tensor:
    return bucket


def bare_future_annotation(state, bucket) -> torch.futures.Future:
    return bucket


def bucket_annotated_wrongly(state, bucket: torch.Tensor):
    return bucket


def annotated_well(state, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    return bucket


def string_annotations(state, bucket) -> "torch.futures.Future[torch.Tensor]":
    return bucket


@pytest.mark.parametrize(
    "hook, says",
    [
        (misnamed, r"the second parameter of misnamed is named 'b'.*KeyError: 'bucket'.*def misnamed\(state, bucket\)"),
        (three_parameters, r"exactly \(state, bucket\); three_parameters takes \['state', 'bucket', 'extra'\]"),
        (returns_a_tensor_by_annotation, r"annotated to return <class 'torch.Tensor'>; a communication hook returns"),
        (
            bare_future_annotation,
            r"DDP's own check refuses bare_future_annotation at register_comm_hook: ValueError: Communication hook: "
            r"return annotation should be torch.futures.Future\[torch.Tensor\]",
        ),
        (bucket_annotated_wrongly, r"ValueError: Communication hook: bucket annotation should be dist.GradBucket"),
        (string_annotations, r"annotated to return the string .*from __future__ import annotations"),
    ],
)
def test_a_hook_ddp_would_refuse_is_refused_before_any_process_starts(hook, says):
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(ValueError, match=says):
        lab.run(hook=hook)
    assert {p.pid for p in psutil.Process().children(recursive=True)} == before


def test_ddp_s_check_passes_a_well_annotated_hook_and_bf16_by_name_stays_measured():
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import bf16_compress_hook

    assert lab.ExperimentConfig(hook=annotated_well).check().hook is annotated_well
    # DDP refuses bf16 hooks by *name* on builds without CUDA/ROCm (TypeError): the lab measures them on any build
    assert lab.ExperimentConfig(hook=bf16_compress_hook).check().hook is bf16_compress_hook
