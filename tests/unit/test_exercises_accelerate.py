"""Notebook 5's checks on their three paths: not attempted, wrong (plausible mistakes, silent ones too), right."""

import pandas as pd
import pytest

from commhooks_lab.exercises import NOT_ATTEMPTED, RIGHT, WRONG
from commhooks_lab.exercises import accelerate as ex
from commhooks_lab.result import Result

accelerate = pytest.importorskip("accelerate")
from accelerate.utils import DDPCommunicationHookType as Hook  # noqa: E402
from accelerate.utils import DistributedDataParallelKwargs  # noqa: E402


def stub():
    """Your code here."""
    raise NotImplementedError


def kwargs(hook=Hook.POWER_SGD, wrapper=Hook.FP16, **options):
    def make():
        return DistributedDataParallelKwargs(comm_hook=hook, comm_wrapper=wrapper, comm_state_option=options)

    return make


RIGHT_OPTIONS = {"matrix_approximation_rank": 2, "start_powerSGD_iter": 3}


def test_kwargs_not_attempted(capsys):
    outcome = ex.check_combined_kwargs(stub)
    assert outcome.status == NOT_ATTEMPTED and outcome.value is ex.combined_kwargs
    assert "not attempted yet" in capsys.readouterr().out


@pytest.mark.parametrize(
    "attempt, says",
    [
        (kwargs(matrix_approximation_rank=2), "compresses 0 of the run's 10 steps"),  # the source document as is
        (kwargs(matrix_approximation_rank=2, start_powerSGD_iter=4), "compresses 6 of the run's 10 steps, 60%"),
        (kwargs(matrix_approximation_rank=2, start_powerSGD_iter=2), "compresses 8 of the run's 10 steps, 80%"),
        (kwargs(matrix_approximation_rank=2, start_powerSGD_iter=7), "compresses 3 of the run's 10 steps, 30%"),
        (kwargs(Hook.FP16, Hook.POWER_SGD, **RIGHT_OPTIONS), "swapped"),
        (kwargs("power_sgd", "fp16", **RIGHT_OPTIONS), "no hook is registered"),  # strings: silently ignored
        (kwargs(Hook.POWER_SGD, Hook.NO, **RIGHT_OPTIONS), "wraps PowerSGD"),
        (kwargs(Hook.BATCHED_POWER_SGD, Hook.FP16, **RIGHT_OPTIONS), "not the hook"),
        (kwargs(start_powerSGD_iter=3), "matrix rank should be 2"),
        (kwargs(**RIGHT_OPTIONS, use_error_feedback=False), "other defaults"),
        (kwargs(**RIGHT_OPTIONS, rank=2), "PowerSGDState takes no"),
        (kwargs(matrix_approximation_rank=2.0, start_powerSGD_iter=3), "a whole number"),  # sizes PowerSGD's matrices
        (kwargs(matrix_approximation_rank=2, start_powerSGD_iter=3.0), "a whole number"),
        (lambda: {"comm_hook": Hook.POWER_SGD}, "return a DistributedDataParallelKwargs"),
    ],
)
def test_kwargs_wrong_attempts_get_a_hint(attempt, says):
    outcome = ex.check_combined_kwargs(attempt)
    assert outcome.status == WRONG and says in outcome.message, outcome.message
    assert outcome.value is ex.combined_kwargs


def test_kwargs_right():
    attempt = kwargs(**RIGHT_OPTIONS, min_compression_rate=2)  # naming a default explicitly is fine
    outcome = ex.check_combined_kwargs(attempt)
    assert outcome.status == RIGHT and outcome.value is attempt
    assert ex.check_combined_kwargs(ex.combined_kwargs).status == RIGHT


def run(errors):
    return Result({}, pd.DataFrame({"step": range(len(errors)), "rel_error": errors}), pd.DataFrame())


def test_fp16_wrapper_prediction_on_its_three_paths():
    plain, wrapped = run([0, 0, 0.9, 0.93, 1.0]), run([3e-4, 3e-4, 0.9, 0.931, 1.0])
    assert ex.fp16_wrapper_effect(plain, wrapped, first_step=2) == "about the same"
    assert ex.check_fp16_wrapper_prediction(None, plain, wrapped, 2).status == NOT_ATTEMPTED
    wrong = ex.check_fp16_wrapper_prediction("lower", plain, wrapped, 2)
    assert wrong.status == WRONG and "unit roundoff" in wrong.message and "about the same" not in wrong.message
    assert "not one of the choices" in ex.check_fp16_wrapper_prediction("less", plain, wrapped, 2).message
    assert ex.check_fp16_wrapper_prediction("about the same", plain, wrapped, 2).status == RIGHT


@pytest.mark.parametrize(
    "wrong, errors, hint",
    [
        ("lower", ([0, 0, 0.9, 0.93, 1.0], [3e-4, 3e-4, 0.9, 0.931, 1.0]), "Can rounding each number"),
        ("higher", ([0, 0, 0.9, 0.93, 1.0], [3e-4, 3e-4, 0.9, 0.931, 1.0]), "how large is it next to"),
        ("about the same", ([0, 0, 0.9, 0.9], [0, 0, 1.2, 1.2]), "compare the two sizes of error"),  # if it were not
        ("less", ([0, 0, 0.9], [0, 0, 0.9]), "'less' is not one of the choices"),
        ("same", ([0, 0, 0.9], [0, 0, 0.9]), "'same' is not one of the choices"),
        ("Higher", ([0, 0, 0.9], [0, 0, 0.9]), "spelt exactly so"),
        (1.0, ([0, 0, 0.9], [0, 0, 0.9]), "not the float 1.0"),
        (True, ([0, 0, 0.9], [0, 0, 0.9]), "not the bool True"),
    ],
)
def test_fp16_wrapper_wrong_and_malformed_answers_get_their_own_message(wrong, errors, hint):
    outcome = ex.check_fp16_wrapper_prediction(wrong, run(errors[0]), run(errors[1]), 2)
    assert outcome.status == WRONG and hint in outcome.message, outcome.message
    assert "PowerSGD decides" not in outcome.message


def test_fp16_wrapper_effect_compares_only_powersgds_own_steps():
    plain, wrapped = run([0, 0, 0.9, 0.9]), run([0.5, 0.5, 0.5, 0.5])
    assert ex.fp16_wrapper_effect(plain, wrapped, first_step=2) == "lower"
    assert ex.fp16_wrapper_effect(run([0.0, 0.9]), run([0.0, 1.2]), first_step=1) == "higher"
