"""Notebook 15's exercise: an entry that beats every baseline, fed the stub, the reference entry and the slips its
hints name, at 2, 3 and 4 ranks."""

import pytest
import torch
import torch.distributed as dist

import commhooks_lab as lab
from commhooks_lab import Cluster
from commhooks_lab.exercises import NOT_ATTEMPTED, RIGHT, WRONG
from commhooks_lab.exercises import the_hook_challenge as exercise

pytestmark = pytest.mark.usefixtures("no_leftover_processes")


@pytest.fixture(scope="module")
def clusters():
    with Cluster(world_size=2) as two, Cluster(world_size=3) as three, Cluster(world_size=4) as four:
        yield [two, three, four]


@pytest.fixture(scope="module")
def baselines(clusters):
    """The best baseline (PowerSGD r4, the bar) and fp16 (whose bytes the hint compares): the notebook passes all
    of lab.challenge.baselines()."""
    spec = lab.challenge.BASELINES["PowerSGD r4"]
    return [lab.challenge.score(spec, label="PowerSGD r4", cluster=clusters[0]),
            lab.challenge.score("fp16", label="fp16", cluster=clusters[0])]  # fmt: skip


def stub(state, bucket):
    raise NotImplementedError


def summed(state, bucket):  # the sum, never divided
    return dist.all_reduce(bucket.buffer(), async_op=True).get_future().then(lambda f: f.value()[0])


def by_two(state, bucket):  # a 2 where the world size belongs
    tensor = bucket.buffer().div_(2)
    return dist.all_reduce(tensor, async_op=True).get_future().then(lambda f: f.value()[0])


def own_share(state, bucket):  # each rank keeps its own top-k: no collective, the ranks disagree
    grad = bucket.buffer()
    kept = torch.zeros_like(grad)
    indices = grad.abs().topk(max(1, grad.numel() // 100)).indices
    kept[indices] = grad[indices]
    done = torch.futures.Future()  # a hook's file holds only hook and make_state
    done.set_result(kept)
    return done


def sparse_by_two(state, bucket):  # notebook 7's top-k, 5% of the bucket, decoded with a 2 for the world size
    grad = bucket.buffer()
    indices = grad.abs().topk(max(1, grad.numel() // 20)).indices
    values = grad[indices]
    all_values = [torch.empty_like(values) for _ in range(dist.get_world_size())]
    all_indices = [torch.empty_like(indices) for _ in range(dist.get_world_size())]
    dist.all_gather(all_values, values)
    dist.all_gather(all_indices, indices)
    grad.zero_()
    for v, i in zip(all_values, all_indices):
        grad.index_add_(0, i, v)
    done = torch.futures.Future()  # a hook's file holds only hook and make_state
    done.set_result(grad.div_(2))
    return done


RATIO = 0.01


def uses_a_global(state, bucket):  # reads RATIO, defined beside it: it does not travel to the leaderboard
    grad = bucket.buffer()
    k = max(1, int(RATIO * grad.numel()))
    done = torch.futures.Future()  # a hook's file holds only hook and make_state
    done.set_result(grad.mul_(k / k))
    return done


def imports_os(state, bucket):
    import os

    os.getpid()
    done = torch.futures.Future()  # a hook's file holds only hook and make_state
    done.set_result(bucket.buffer())
    return done


def nothing(state, bucket):  # sends nothing: fast, and no nearer the average than zeros
    done = torch.futures.Future()  # a hook's file holds only hook and make_state
    done.set_result(torch.zeros_like(bucket.buffer()))
    return done


def fp16_by_hand(state, bucket):  # fp16's own bytes: no faster than fp16
    halved = bucket.buffer().to(torch.float16).div_(dist.get_world_size())
    future = dist.all_reduce(halved, async_op=True).get_future()
    return future.then(lambda done: bucket.buffer().copy_(done.value()[0]))


def float32_average(state, bucket):  # the exact average: all-reduce's bytes
    tensor = bucket.buffer().div_(dist.get_world_size())
    return dist.all_reduce(tensor, async_op=True).get_future().then(lambda f: f.value()[0])


def topk_without_memory(state, bucket):  # 0.1% of the bucket and no error feedback: fast, and the accuracy falls
    grad = bucket.buffer()
    k = max(1, grad.numel() // 1000)
    indices = grad.abs().topk(k).indices
    values = grad[indices]
    world = dist.get_world_size()
    all_values = [torch.empty_like(values) for _ in range(world)]
    all_indices = [torch.empty_like(indices) for _ in range(world)]
    dist.all_gather(all_values, values)
    dist.all_gather(all_indices, indices)
    grad.zero_()
    for v, i in zip(all_values, all_indices):
        grad.index_add_(0, i, v)
    done = torch.futures.Future()  # a hook's file holds only hook and make_state
    done.set_result(grad.div_(world))
    return done


def uncounted(state, bucket):  # the ProcessGroup's method, which the byte counter cannot see
    tensor = bucket.buffer().div_(dist.get_world_size())
    dist.group.WORLD.allreduce([tensor]).wait()
    done = torch.futures.Future()  # a hook's file holds only hook and make_state
    done.set_result(tensor)
    return done


def crashes(state, bucket):
    raise ValueError("my bug")


def test_the_stub_is_not_attempted_and_the_reference_entry_beats_every_baseline(clusters, baselines):
    outcome = exercise.check_challenge_entry(stub, None, baselines, clusters)
    assert outcome.status == NOT_ATTEMPTED
    assert outcome.value.hook is exercise.entry_hook
    assert outcome.value.score.value > max(b.value for b in baselines)


def test_the_reference_entry_passes_at_every_size(clusters, baselines):
    outcome = exercise.check_challenge_entry(exercise.entry_hook, exercise.entry_state, baselines, clusters)
    assert outcome.status == RIGHT and "2, 3 and 4 ranks" in outcome.message
    assert f"your entry beats PowerSGD r4's {baselines[0].value:.2f}" in outcome.message
    assert outcome.value.hook is exercise.entry_hook and outcome.value.score.value > baselines[0].value


@pytest.mark.parametrize(
    "attempt, hint",
    [
        (summed, "dividing the sum by dist.get_world_size()"),
        (by_two, "right at 2 ranks, but at 3"),
        (sparse_by_two, "right at 2 ranks, but at 3: given the same gradient g on every rank"),
        (uses_a_global, "your entry uses RATIO, defined outside hook and make_state"),
        (imports_os, "the leaderboard's screen would refuse it: line 6: import os"),
        (own_share, "the ranks hold different gradients"),
        (nothing, "your hook returns zeros"),
        (fp16_by_hand, "on wide and cnn it sends at least fp16's bytes"),
        (float32_average, "on wide and cnn it sends at least fp16's bytes"),
        (topk_without_memory, "loses more accuracy than its bytes earn"),
        (uncounted, "sends bytes the lab's counter cannot see"),
    ],
    ids=lambda v: getattr(v, "__name__", "hint"),
)
def test_wrong_entries_get_the_hint_for_their_mistake(clusters, baselines, attempt, hint):
    outcome = exercise.check_challenge_entry(attempt, None, baselines, clusters)
    assert outcome.status == WRONG and hint in outcome.message, outcome.message
    assert outcome.value.hook is exercise.entry_hook  # the notebook carries on with the reference entry


def test_a_hook_that_raises_is_told_what_it_raised(baselines):
    """On ranks started for it (a rank that raised is replaced, and the module's ranks would change)."""
    outcome = exercise.check_challenge_entry(crashes, None, baselines)
    assert (
        outcome.status == WRONG and "your code raised WorkerError: rank 0 raised ValueError: my bug" in outcome.message
    )


def test_baselines_without_fp16_are_refused_with_what_to_pass():
    with pytest.raises(ValueError, match="lab.challenge.baselines"):
        exercise.check_challenge_entry(stub, None, [])


def test_a_lambda_for_make_state_is_told_to_use_def(baselines):
    outcome = exercise.check_challenge_entry(exercise.entry_hook, lambda group: {}, baselines)
    assert outcome.status == WRONG and "give make_state as a function written with def" in outcome.message


def test_a_written_entry_passes_the_screen_and_names_hook_and_make_state(tmp_path):
    entry = exercise.Entry(exercise.entry_hook, exercise.entry_state, lab.challenge.Score("x"))
    path = exercise.write_entry(entry, tmp_path / "entries")
    source = path.read_text()
    assert lab.challenge.screen(source) == []
    assert "@reference" not in source and "hook = entry_hook" in source and "make_state = entry_state" in source
    namespace: dict = {}
    exec(compile(source, str(path), "exec"), namespace)  # a module of its own: every name it uses is defined
    assert namespace["hook"].__name__ == "entry_hook" and namespace["make_state"](None)["ratio"] == 0.01
