"""The challenge's score, in-process: the same bits twice, the baselines ranked as the formula says, every byte a
hook sends counted, and a hook that breaks DDP's invariant disqualified with the reason."""

import pytest

from commhooks_lab import plots
from commhooks_lab.challenge.score import BASELINES, Score, points, score, table
from commhooks_lab.challenge.score import baselines as score_baselines
from commhooks_lab.challenge.tasks import ChallengeTask
from commhooks_lab.launcher import netns_switch

pytestmark = pytest.mark.usefixtures("no_leftover_processes")

CNN = (ChallengeTask("cnn", steps=30),)
SHORT = (ChallengeTask("cnn", steps=4),)
CNN_PARAMETERS = 9930  # conv16 (160) + conv32 (4,640) + linear (5,130)


@pytest.fixture(scope="module")
def baselines(cluster):
    """Every baseline, best first (as ``lab.challenge.baselines`` ranks them), by name."""
    return {s.label: s for s in score_baselines(cluster=cluster, tasks=CNN)}


def test_the_baselines_rank_as_the_formula_says(baselines):
    """The score is its stated formula of its printed parts, and the ranking it gives is held fixed."""
    for name, scored in baselines.items():
        (part,) = scored.tasks
        assert scored.disqualified is None, name
        assert scored.value == 100 * points(part["accuracy"], part["t_allreduce_s"], part["t_hook_s"])
    assert baselines["all-reduce"].tasks[0]["speed"] == 1.0  # the reference is all-reduce's own bytes and calls
    assert baselines["all-reduce"].tasks[0]["bytes_per_rank"] == 4 * CNN_PARAMETERS * 30
    assert baselines["fp16"].tasks[0]["bytes_per_rank"] * 2 == baselines["all-reduce"].tasks[0]["bytes_per_rank"]
    assert list(baselines) == ["top-k 1% + EF", "PowerSGD r4", "fp16", "PowerSGD r1", "all-reduce"]
    assert set(baselines) == set(BASELINES)


def test_the_table_and_the_figure_show_each_entrys_parts(baselines):
    scores = list(baselines.values())
    frame = table(scores)
    assert list(frame.index) == list(baselines)
    for name, scored in baselines.items():
        assert frame.loc[name, "score"] == scored.value and frame.loc[name, "cnn speed"] == scored.tasks[0]["speed"]
    fig = plots.challenge_scores([*scores, Score("refused", disqualified="import os")])
    (ax,) = fig.axes
    drawn = {
        line.get_label(): (line.get_xdata()[0], line.get_ydata()[0]) for line in ax.lines if line.get_marker() == "o"
    }
    assert drawn == {name: (s.tasks[0]["speed"], s.tasks[0]["accuracy"]) for name, s in baselines.items()}
    curves = [line for line in ax.lines if line.get_linestyle() == ":"]
    for curve in curves:  # each dotted curve is one number of points: accuracy x speed constant along it
        product = curve.get_xdata() * curve.get_ydata()
        assert product.max() - product.min() < 1e-12
    assert [t.get_text() for t in ax.get_legend().get_texts()] == list(baselines)


def test_a_score_is_the_same_bits_twice_and_survives_its_json(cluster, baselines):
    again = score(BASELINES["PowerSGD r1"], tasks=CNN, cluster=cluster)
    first = baselines["PowerSGD r1"]
    assert again.to_dict() == first.to_dict() and again.fingerprint == first.fingerprint
    assert Score.from_dict(again.to_dict()).fingerprint == first.fingerprint
    assert baselines["fp16"].fingerprint != first.fingerprint
    report = first.report()
    assert "score = 100 x mean over tasks" in report and f"{first.value:.2f}" in report and "1 Gbit/s" in report


def test_a_collective_the_hook_calls_itself_counts(cluster):
    from _challenge_hooks import EXTRA, allreduce_and_broadcast

    scored = score(allreduce_and_broadcast, tasks=SHORT, cluster=cluster)
    assert scored.disqualified is None
    assert scored.tasks[0]["bytes_per_rank"] == 4 * (CNN_PARAMETERS + EXTRA) * 4  # 4 steps, rank 0 broadcasts


def test_bytes_the_counter_cannot_see_disqualify(cluster):
    from _challenge_hooks import through_the_process_group

    scored = score(through_the_process_group, tasks=SHORT, cluster=cluster)
    assert scored.value is None and "sends bytes the lab's counter cannot see" in scored.disqualified


def test_a_hook_that_breaks_the_invariant_is_disqualified(cluster):
    scored = score("noop", tasks=SHORT, cluster=cluster)
    assert scored.value is None
    assert scored.disqualified.startswith("breaks DDP's invariant: after the hook the ranks hold different gradients")
    assert "DISQUALIFIED" in scored.report()


@pytest.mark.skipif(netns_switch.why_unavailable() is not None, reason="no links here: they need user namespaces")
def test_time_behind_a_real_link_is_reported_beside_the_score_and_left_out_of_it(cluster):
    plain = score("fp16", tasks=SHORT, cluster=cluster)
    timed = score("fp16", tasks=SHORT, cluster=cluster, link="1gbit")
    assert timed.tasks == plain.tasks and timed.fingerprint == plain.fingerprint  # measured, not scored
    (row,) = timed.measured
    for side in ("hook", "allreduce"):
        assert 0 < row[side]["min_ms"] <= row[side]["median_ms"] <= row[side]["max_ms"]
    assert row["link"] == "1gbit" and Score.from_dict(timed.to_dict()).measured == timed.measured
    assert "measured here behind 1gbit (varies from machine to machine; not in the score): cnn" in timed.report()
