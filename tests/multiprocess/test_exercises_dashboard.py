"""Notebook 6's exercise checks on their three paths: not attempted, wrong (plausible wrong answers), right."""

from types import SimpleNamespace

import pandas as pd
import pytest

from commhooks_lab.engine.models import build_task
from commhooks_lab.exercises import NOT_ATTEMPTED, RIGHT, WRONG
from commhooks_lab.exercises import dashboard as ex
from commhooks_lab.studies import network as netmodel

pytestmark = pytest.mark.usefixtures("no_leftover_processes")


def fake_run(cumulative):
    return SimpleNamespace(steps=pd.DataFrame({"cumulative_rel_error": cumulative}))


def test_warm_start_prediction_on_its_three_paths():
    both_on, without_ws = fake_run([0.8, 0.45]), fake_run([0.8, 0.52])
    outcome = ex.check_warm_start_prediction(None, both_on, without_ws)
    assert outcome.status == NOT_ATTEMPTED and outcome.value == "higher"
    wrong = ex.check_warm_start_prediction("lower", both_on, without_ws)  # plausible: "error feedback makes up for it"
    assert wrong.status == WRONG and "from fresh random numbers" in wrong.message
    assert "higher" not in wrong.message and "0.52" not in wrong.message  # no answer, no measured end points
    assert ex.check_warm_start_prediction("up", both_on, without_ws).status == WRONG
    right = ex.check_warm_start_prediction("higher", both_on, without_ws)
    assert right.status == RIGHT and "0.520 without warm start and 0.450" in right.message
    assert ex.check_warm_start_prediction("lower", without_ws, both_on).status == RIGHT  # follows the data


@pytest.mark.parametrize(
    "wrong, flipped, hint",
    [
        ("lower", False, "from fresh random numbers"),  # the one wrong choice in the notebook's run
        ("higher", True, "in this run, how much did each step leave out"),  # the other, were the data the other way
        ("up", False, "'up' is not one of the choices"),
        ("Higher", False, "spelt exactly so"),
        (True, False, "not the bool True"),
        (0.52, False, "not the float 0.52"),
    ],
)
def test_warm_start_wrong_and_malformed_answers_get_their_own_message(wrong, flipped, hint):
    both_on, without_ws = fake_run([0.8, 0.45]), fake_run([0.8, 0.52])
    if flipped:
        both_on, without_ws = without_ws, both_on
    outcome = ex.check_warm_start_prediction(wrong, both_on, without_ws)
    assert outcome.status == WRONG and hint in outcome.message, outcome.message
    assert "whatever Q" not in outcome.message


def test_reference_answer_from_the_byte_rules():
    mlp = netmodel.parameter_shapes(build_task("mlp", 0).model)
    assert ex.half_bytes_rank(mlp) == 18
    assert ex.uncompressed_from(mlp) == {"128x64": 22, "10x128": 5}
    assert ex.uncompressed_from([(10, 100)], min_compression_rate=0.01) == {"10x100": None}  # never


def test_half_bytes_rank_check_on_its_three_paths(cluster, capsys):
    outcome = ex.check_half_bytes_rank(None, cluster=cluster)
    assert outcome.status == NOT_ATTEMPTED and outcome.value == 18
    assert "not attempted yet" in capsys.readouterr().out
    too_small = ex.check_half_bytes_rank(5, cluster=cluster)  # plausible: where the 10 x 128 layer switches
    assert too_small.status == WRONG and "larger matrix ranks" in too_small.message and "18" not in too_small.message
    too_large = ex.check_half_bytes_rank(22, cluster=cluster)  # plausible: "until nothing is compressed"
    assert too_large.status == WRONG and "smaller matrix ranks" in too_large.message
    assert "goes uncompressed from matrix rank 5 on" in too_small.message  # where the 10 x 128 layer switches
    assert "every matrix goes uncompressed" in too_large.message
    one_below = ex.check_half_bytes_rank(17, cluster=cluster)
    assert one_below.status == WRONG and "larger matrix ranks" in one_below.message
    assert "goes uncompressed" not in one_below.message
    one_above = ex.check_half_bytes_rank(19, cluster=cluster)
    assert one_above.status == WRONG and "smaller matrix ranks" in one_above.message
    assert "every matrix" not in one_above.message and "18" not in one_above.message  # the hint never answers
    for malformed in ("18", 0, 2.5, True, -3):
        outcome = ex.check_half_bytes_rank(malformed, cluster=cluster)
        assert outcome.status == WRONG and "a matrix rank is a whole number >= 1" in outcome.message
    right = ex.check_half_bytes_rank(18, cluster=cluster)
    assert right.status == RIGHT and "10x128 from r = 5" in right.message
