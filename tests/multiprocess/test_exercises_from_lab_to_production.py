"""Notebook 13's measurements: overlap bucket by bucket, gradient accumulation with no_sync(), and its exercise."""

import pytest

from commhooks_lab import WorkerError
from commhooks_lab.exercises import NOT_ATTEMPTED, RIGHT, WRONG
from commhooks_lab.exercises import from_lab_to_production as exercise
from commhooks_lab.studies import accumulation, overlap
from commhooks_lab.studies.overlap import hidden_share

pytestmark = pytest.mark.usefixtures("no_leftover_processes")


def test_hidden_share_merges_buckets_and_cuts_out_hook_calls():
    # one async bucket sending [1, 3] while autograd computes until 4, except [1, 1.1] inside the hook call
    assert hidden_share([(1.0, 1.1, 3.0), (4.0, 4.1, 6.0)]) == pytest.approx(1.9 / 4)
    assert hidden_share([(1.0, 2.0, 2.0), (3.0, 4.5, 4.5)]) == 0.0  # blocking: sent inside the calls
    # two buckets sending at once count once: [0.5, 4.0] is one interval of 3.5 s
    assert hidden_share([(0.5, 0.6, 4.0), (1.0, 1.1, 3.5), (4.0, 4.1, 4.2)]) == pytest.approx((3.5 - 0.2) / 3.7)


@pytest.fixture(scope="module")
def timeline(cluster):
    return overlap.bucket_timeline(depth=4, repeats=2, cluster=cluster)


def test_the_timeline_sees_every_bucket_and_tells_blocking_hooks_apart(timeline):
    assert set(timeline["hook"]) == set(overlap.HOOKS) and set(timeline["rank"]) == {0, 1}
    summary = overlap.overlap_summary(timeline)
    assert (summary["buckets"] == 4).all()  # four 512 x 512 layers, one per 1 MiB bucket
    assert (timeline["ready"] <= timeline["returned"]).all() and (timeline["returned"] <= timeline["done"]).all()
    assert (timeline["done"] <= timeline["end"] + 1e-6).all()  # DDP waits for every Future before backward returns
    blocking = summary.loc[["topk", "allreduce (lab probe)"]]
    assert (blocking["pending_at_return"] == 0).all() and (blocking["hidden_share"] < 0.05).all()
    assert (summary.loc[["allreduce", "fp16"], "pending_at_return"] > 0).all()  # they return before it is sent


def test_the_timeline_exercise_on_its_three_paths(timeline, capsys):
    def stub(buckets):
        raise NotImplementedError

    untried = exercise.check_hidden_share(stub, timeline)
    assert untried.status == NOT_ATTEMPTED and "Nothing later in the notebook depends on it" in untried.message

    def without_hook_calls(buckets):  # plausible and wrong: autograd computes all the way to the last ready
        end = max(r for r, _, _ in buckets)
        merged = overlap.merged_intervals([(r, d) for r, _, d in buckets])
        return sum(max(0.0, min(b, end) - a) for a, b in merged) / sum(b - a for a, b in merged)

    def without_merging(buckets):  # plausible and wrong: adds overlapping intervals twice
        return sum(hidden_share([b]) * (b[2] - b[0]) for b in buckets) / sum(d - r for r, _, d in buckets)

    cut = exercise.check_hidden_share(without_hook_calls, timeline)
    assert cut.status == WRONG and "inside a hook call" in cut.message and cut.value is hidden_share
    assert exercise.check_hidden_share(without_merging, timeline).status == WRONG
    right = exercise.check_hidden_share(lambda buckets: hidden_share(list(buckets)), timeline)
    assert right.status == RIGHT and "4 measured ones" in right.message


def counted_twice(buckets):  # every bucket's own overlap with compute, overlapping buckets added twice
    computing = overlap.computing_spans(buckets)
    hidden = sum(overlap.overlap_length([(r, d)], computing) for r, _, d in buckets)
    return hidden / sum(d - r for r, _, d in buckets)


def hook_calls_as_compute(buckets):
    comm = overlap.merged_intervals([(r, d) for r, _, d in buckets])
    return overlap.overlap_length(comm, [(0.0, max(r for r, _, _ in buckets))]) / overlap.total_length(comm)


def after_the_last_gradient(buckets):
    comm = overlap.merged_intervals([(r, d) for r, _, d in buckets])
    return overlap.overlap_length(comm, [(0.0, max(d for _, _, d in buckets))]) / overlap.total_length(comm)


def by_backward_time(buckets):
    comm = overlap.merged_intervals([(r, d) for r, _, d in buckets])
    return overlap.overlap_length(comm, overlap.computing_spans(buckets)) / max(d for _, _, d in buckets)


HAND_MADE = {tuple(b): hidden_share(b) for b in exercise.CASES.values()}


@pytest.mark.parametrize(
    "attempt, hint",
    [
        (counted_twice, "merge the intervals"),
        (hook_calls_as_compute, "inside a hook call"),
        (after_the_last_gradient, "what is sent after that is exposed"),
        (by_backward_time, "divide by the communication time"),
        (lambda buckets: 100 * hidden_share(buckets), "not a percentage"),
        (lambda buckets: HAND_MADE.get(tuple(buckets), 0.5), "right on the hand-made backwards"),  # a lookup table
        (lambda buckets: 0.5, "for every hand-made backward"),  # a hard-coded number
        (lambda buckets: hidden_share(buckets) * 0.9, "draw its intervals on a line"),
    ],
    ids=["counted_twice", "hook_calls", "after_last", "backward_time", "percentage", "lookup", "constant", "other"],
)
def test_the_timeline_exercise_wrong_answers_get_their_own_hint(attempt, hint, timeline):
    outcome = exercise.check_hidden_share(attempt, timeline)
    assert outcome.status == WRONG and hint in outcome.message, outcome.message


def test_accumulation_pays_bytes_per_optimizer_step_and_powersgd_counts_optimizer_steps(cluster):
    table = accumulation.accumulation_table(steps=3, cluster=cluster)
    one, four = (table[table["micro_batches"] == k].reset_index(drop=True) for k in (1, 4))
    assert (one["payload_bytes"] == four["payload_bytes"]).all() and (table["hook_calls"] == 1).all()
    power = four[four["hook"] == "power_sgd"]
    assert power["power_sgd_iter"].tolist() == [1, 2, 3]  # one per synced backward, not per micro-batch
    assert power["payload_bytes"].iloc[2] < power["payload_bytes"].iloc[0]  # compresses from optimizer step 2
    assert table["ranks_agree"].all()


def test_the_agreement_check_catches_a_hook_that_does_not_reduce(cluster):
    table = accumulation.accumulation_table(hooks=("noop",), micro_batches=(4,), steps=1, cluster=cluster)
    assert not table["ranks_agree"].any() and (table["payload_bytes"] == 0).all()


def test_static_graph_with_no_sync_needs_a_synced_first_step(cluster):
    with pytest.raises(WorkerError, match="expect_autograd_hooks_ INTERNAL ASSERT FAILED"):
        accumulation.accumulation_table(hooks=("allreduce",), micro_batches=(2,), steps=1, static_graph=True)
    warm = accumulation.accumulation_table(
        hooks=("allreduce",), micro_batches=(2,), steps=2, static_graph=True, warm_sync=True, cluster=cluster
    )
    assert warm["ranks_agree"].all()


def _merged(intervals, *, in_order=True, longest=True):
    """Intervals merged as a learner might: sorted or as listed, ending at the later end or at the last one's."""
    merged = []
    for start, stop in sorted(intervals) if in_order else intervals:
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], stop) if longest else stop)
        else:
            merged.append((start, stop))
    return merged


def _share(buckets, **how):
    comm = _merged([(r, d) for r, _, d in buckets], **how)
    end = max(r for r, _, _ in buckets)
    computing, at = [], 0.0
    for a, b in _merged([(r, min(t, end)) for r, t, _ in buckets if r < end], **how):
        computing.append((at, a))
        at = b
    return overlap.overlap_length(comm, [*computing, (at, end)]) / overlap.total_length(comm)


def merged_as_listed(buckets):  # issue 50: right whenever the buckets come sorted by ready
    return _share(buckets, in_order=False)


def ended_at_the_last_stop(buckets):  # a short bucket inside a longer one cuts the merged interval short
    return _share(buckets, longest=False)


@pytest.mark.parametrize(
    "attempt, hint",
    [
        (merged_as_listed, "sort the intervals by their start before you merge them"),
        (ended_at_the_last_stop, "end it at the later of the two ends, max(end, stop)"),
    ],
    ids=["as_listed", "last_stop"],
)
def test_the_hand_made_backwards_alone_catch_unsorted_and_shortened_merges(attempt, hint):
    """Without a measured timeline: before issue 50 both passed there (every hand-made backward came sorted by ready,
    none had a bucket inside another's time), and the unsorted one was caught only by fp16's measured order."""
    outcome = exercise.check_hidden_share(attempt)
    assert outcome.status == WRONG and hint in outcome.message, outcome.message
    assert exercise.check_hidden_share(lambda buckets: _share(buckets)).status == RIGHT  # the same code, right
