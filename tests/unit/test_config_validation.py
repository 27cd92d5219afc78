"""Every option a run or a launch takes is checked before any process starts, with a message that names it.

One file for the option checks (``ExperimentConfig.check``, ``lab.run``/``lab.compare``, ``launch``): what a run
asks for, the numbers it takes, how its ranks start, compiling, checkpoints. No test here starts a process.
"""

import math

import _workers
import psutil
import pytest

import commhooks_lab as lab
from commhooks_lab import ExperimentConfig, launch
from commhooks_lab.hooks.compressors import TopK
from commhooks_lab.launcher import session


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


# -- what a run asks for: hook, state options, wrapper, model, optimizer, api -----------------------------------


@pytest.mark.parametrize(
    "changes, text",
    [
        (
            {"hook": "power_sgd", "state_options": {"matrix_aproximation_rank": 2}},
            "did you mean 'matrix_approximation_rank'",
        ),
        ({"hook": "power_sgd", "state_options": {"matrix_approximation_rank": 0}}, "matrix_approximation_rank must be"),
        ({"hook": "power_sgd", "state_options": {"start_powerSGD_iter": 1}}, "DDP rebuilds its gradient buckets"),
        ({"hook": "fp16", "state_options": {"matrix_approximation_rank": 2}}, "keeps no state"),
        ({"hook": "fp61"}, "did you mean 'fp16'"),
        ({"hook": "no", "wrapper": "fp16"}, "needs a hook to wrap"),
        ({"wrapper": "int8"}, "unknown wrapper"),
        ({"hook": lambda state: None}, "exactly \\(state, bucket\\)"),
        ({"hook": "nowhere:hook"}, "cannot import hook"),
        ({"model": "resnet"}, "unknown model"),
        ({"steps": 0}, "steps must be"),
        ({"lr": -1}, "lr must be"),
        ({"optimizer": "lion"}, "unknown optimizer"),
        ({"world_size": 0}, "at least 1"),
        ({"api": "jax"}, "unknown api"),
        ({"hook": TopK(0.01), "wrapper": "fp16"}, "makes its own payload"),
        ({"hook": TopK(0.01), "state_options": {"rank": 2}}, "takes only state_options"),
    ],
)
def test_bad_hook_model_and_training_options_are_refused_before_any_process_starts(changes, text):
    before = _children()
    with pytest.raises(ValueError, match=text):
        lab.run(**changes)
    with pytest.raises(ValueError, match=text):
        lab.compare(["allreduce", changes])
    assert _children() == before


# -- numbers out of range -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "changes, error, text",
    [
        ({"timeout_s": math.inf}, ValueError, "timeout_s must be a finite number of seconds"),
        ({"timeout_s": math.nan}, ValueError, "timeout_s must be a finite number"),
        ({"seed": 2**70}, ValueError, "seed must be an int >= 0 and <="),
        ({"bucket_cap_mb": math.inf}, ValueError, "bucket_cap_mb must be a finite number > 0"),
        ({"lr": math.inf}, ValueError, "lr must be a finite number > 0"),
        ({"lr": math.nan}, ValueError, "lr must be a finite number > 0"),
        ({"steps": 10**30}, ValueError, "steps must be a positive int, at most"),
        ({"state_options": "matrix_approximation_rank=2"}, TypeError, "state_options must be a dict"),
    ],
)
def test_numbers_out_of_range_are_refused_before_any_process_starts(changes, error, text):
    before = _children()
    with pytest.raises(error, match=text):
        lab.run(**{"steps": 2, **changes})
    assert session.active() == [] and _children() == before


# -- how the ranks start ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, error, text",
    [
        ({"world_size": 0}, ValueError, "at least 1"),
        ({"world_size": -2}, ValueError, "at least 1"),
        ({"world_size": 2.5}, TypeError, "positive int"),
        ({"world_size": True}, TypeError, "positive int"),
        ({"world_size": "2"}, TypeError, "positive int"),
        ({"world_size": 10_000}, ValueError, "torchrun"),
        ({"timeout_s": 0}, ValueError, "timeout_s"),
        ({"timeout_s": -1.0}, ValueError, "timeout_s"),
        ({"backend": "mpi"}, ValueError, "unknown backend"),
        ({"backend": "nccl"}, ValueError, "one CUDA device per rank"),
        ({"start_method": "thread"}, ValueError, "unknown start_method"),
    ],
)
def test_bad_launch_options_are_refused_before_any_process_starts(kwargs, error, text):
    before = _children()
    with pytest.raises(error, match=text):
        launch(_workers.pid, **kwargs)
    assert _children() == before


# -- compiling ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"hook": "power_sgd"}, "power_sgd r1 cannot run under compiled autograd: PowerSGD works on whole buckets"),
        ({"hook": "allreduce", "wrapper": "fp16"}, "fp16_compress_wrapper calls bucket.set_buffer"),
        ({"hook": "fp16", "measure": True}, "needs measure=False"),
        ({"hook": "fp16", "api": "accelerate"}, "api='torch'"),
    ],
)
def test_runs_that_cannot_compile_are_refused_before_any_process_starts(changes, message):
    config = ExperimentConfig(compile="compiled_autograd", measure=False).replace(**changes)
    with pytest.raises(ValueError, match=message):
        config.check()
    with pytest.raises(ValueError, match="unknown compile 'jit'"):
        ExperimentConfig(compile="jit").check()


# -- checkpoints -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"checkpoint_at": 3}, "needs checkpoint_dir"),
        ({"checkpoint_at": 30, "checkpoint_dir": "x"}, "after the last step"),
        ({"checkpoint_at": 0, "checkpoint_dir": "x"}, "checkpoint_at must be a positive int"),
        ({"checkpoint_at": 3, "checkpoint_dir": "x", "api": "accelerate", "hook": "fp16"}, "api='torch'"),
        ({"resume_from": "/nonexistent/folder"}, "run.json is missing"),
    ],
)
def test_bad_checkpoint_options_are_refused(changes, message):
    with pytest.raises(ValueError, match=message):
        ExperimentConfig(steps=10, **changes).check()
