"""Every exercise check on its three paths: not attempted, wrong (with a plausible wrong algorithm), right."""

import pytest
import torch
import torch.distributed as dist

from commhooks_lab import Cluster, exercises
from commhooks_lab.exercises import NOT_ATTEMPTED, RIGHT, WRONG
from commhooks_lab.exercises import write_your_own_hook as compressing_hooks

pytestmark = pytest.mark.usefixtures("no_leftover_processes")


def stub(x, k):
    """Your code here."""
    raise NotImplementedError


def topk_by_value(x, k):  # plausible and wrong: the largest values, not the largest magnitudes
    values, indices = x.reshape(-1).topk(k)
    return values, indices


def topk_magnitudes(x, k):  # wrong: sends |x| instead of x
    flat = x.reshape(-1)
    values, indices = flat.abs().topk(k)
    return values, indices


def topk_right(x, k):
    indices = x.reshape(-1).abs().argsort(descending=True)[:k]
    return x.reshape(-1)[indices], indices


def scaffold(x, k):  # given lines around the learner's part, which is still missing
    flat = x.reshape(-1)
    raise NotImplementedError
    return flat[:k], torch.arange(k)


def guarded(x, k):  # code that raises NotImplementedError only in a branch is an attempt
    if k < 0:
        raise NotImplementedError
    return topk_right(x, k)


def test_is_stub_tells_stubs_from_code():
    assert exercises.is_stub(None) and exercises.is_stub(stub) and exercises.is_stub(scaffold)
    assert not exercises.is_stub(topk_right) and not exercises.is_stub(42) and not exercises.is_stub(guarded)


def test_topk_check_on_its_three_paths(capsys):
    outcome = compressing_hooks.check_topk(stub)
    assert outcome.status == NOT_ATTEMPTED and outcome.value is compressing_hooks.topk
    assert "not attempted yet" in capsys.readouterr().out
    outcome = compressing_hooks.check_topk(topk_by_value)
    assert outcome.status == WRONG and outcome.value is compressing_hooks.topk
    assert "rank the entries by x.abs()" in capsys.readouterr().out
    assert "signed value" in compressing_hooks.check_topk(topk_magnitudes).message
    outcome = compressing_hooks.check_topk(topk_right)
    assert outcome.status == RIGHT and outcome.value is topk_right


def topk_fixed_k(x, k):  # right on the case k = 25 only
    return topk_right(x, 25)


def topk_smallest(x, k):  # ascending order: the smallest magnitudes
    indices = x.reshape(-1).abs().argsort()[:k]
    return x.reshape(-1)[indices], indices


def topk_first(x, k):  # a hard-coded slice: no ranking at all
    return x.reshape(-1)[:k], torch.arange(k)


def topk_per_row(x, k):  # right on vectors only: Tensor.topk works along the last dimension
    indices = x.abs().topk(k).indices
    return x.gather(-1, indices), indices


def topk_one_more(x, k):
    return topk_right(x, k + 1)


def topk_unflattened_values(x, k):  # indices into the flat tensor, but values read from x itself
    _, indices = topk_right(x, k)
    return x.reshape(-1)[indices] * 0 + x.reshape(-1)[indices].roll(1), indices


@pytest.mark.parametrize(
    "attempt, hint",
    [
        (topk_by_value, "rank the entries by x.abs(), not by x"),
        (topk_magnitudes, "signed value"),
        (topk_fixed_k, "Use the k argument"),
        (topk_smallest, "smallest magnitudes"),
        (topk_first, "you kept the first 25 entries"),
        (topk_per_row, "Flatten x first"),
        (topk_one_more, "expected 25 values and 25 indices, got 26 and 26"),
        (topk_unflattened_values, "the entry at that position"),
    ],
    ids=lambda x: x.__name__ if callable(x) else "",
)
def test_topk_wrong_answers_get_their_own_hint(attempt, hint):
    outcome = compressing_hooks.check_topk(attempt)
    assert outcome.status == WRONG and hint in outcome.message, outcome.message
    assert outcome.value is compressing_hooks.topk


def test_a_check_says_what_the_learners_code_raised():
    def broken(x, k):
        return x[k + 10_000], None

    outcome = compressing_hooks.check_topk(broken)
    assert outcome.status == WRONG and "your code raised IndexError" in outcome.message


def test_reveal_prints_the_reference_only_on_request(capsys):
    exercises.reveal("topk")
    assert "def topk(x" in capsys.readouterr().out
    with pytest.raises(KeyError, match="no exercise"):
        exercises.reveal("nope")


def test_prediction_on_its_three_paths():
    assert exercises.check_prediction("q", None, 4, "look at the spectrum").status == NOT_ATTEMPTED
    wrong = exercises.check_prediction("q", 2, 4, "look at the spectrum")
    assert wrong.status == WRONG and "look at the spectrum" in wrong.message and "4" not in wrong.message
    assert exercises.check_prediction("q", 4, 4, "hint").status == RIGHT


# -- hooks, run through the lab on a warm cluster --------------------------------------------------


def topk_hook_stub(state, bucket):
    raise NotImplementedError


def stored_residual(state, bucket):
    """The bucket's residual, joined from its parameters' (zeros the first time), as the reference keeps it."""
    return torch.cat([state["residuals"].get(p, torch.zeros(p.numel())) for p in bucket.parameters()])


def store_residual(state, bucket, residual):
    params = bucket.parameters()
    state["residuals"].update(zip(params, residual.split([p.numel() for p in params])))


def topk_by_bucket_index(state, bucket):  # plausible and wrong: the first reference, wrong after DDP's rebuild
    residuals, index = state["residuals"], bucket.index()
    corrected = bucket.buffer() + residuals.get(index, 0)
    return gathered_topk(state, bucket, corrected, lambda residual: residuals.update({index: residual}))


def topk_one_residual(state, bucket):  # plausible and wrong: one residual for every bucket, every step
    corrected = bucket.buffer() + state.get("residual", 0)
    return gathered_topk(state, bucket, corrected, lambda residual: state.update(residual=residual))


def topk_k_of_the_mlp(state, bucket):  # a hard-coded k: 1% of the MLP's 9,610 entries, right on one bucket only
    corrected = bucket.buffer() + stored_residual(state, bucket)
    return gathered_topk(state, bucket, corrected, lambda residual: store_residual(state, bucket, residual), k=96)


def gathered_topk(
    state,
    bucket,
    corrected,
    keep,
    *,
    k=None,
    gather=True,
    dense=False,
    index_dtype=torch.int64,
    divide=True,
    at_least_one=True,
):
    """The reference's top-k, all-gather and decode, with the residual kept by ``keep``, or with one slip
    (``divide``: True for the world size, a number for that number)."""
    world = dist.get_world_size()
    grad = bucket.buffer()
    kept = int(state["ratio"] * grad.numel())
    values, indices = compressing_hooks.topk(corrected, k or (max(1, kept) if at_least_one else kept))
    sent = torch.zeros_like(corrected)
    sent[indices] = values
    if state.get("error_feedback", True):
        keep(corrected - sent)
    if dense:  # the sparsified bucket, all-reduced whole
        dist.all_reduce(sent)
        grad.copy_(sent)
    elif gather:
        indices = indices.to(index_dtype)
        gathered_v = [torch.empty_like(values) for _ in range(world)]
        gathered_i = [torch.empty_like(indices) for _ in range(world)]
        dist.all_gather(gathered_v, values)
        dist.all_gather(gathered_i, indices)
        grad.zero_()
        for v, i in zip(gathered_v, gathered_i):
            grad.index_add_(0, i.long(), v)
    else:  # each rank decodes its own top-k only
        grad.copy_(sent)
    if divide:
        grad.div_(world if divide is True else divide)
    future = torch.futures.Future()
    future.set_result(grad)
    return future


def topk_hook_variant(**slip):
    """The reference top-k hook with one slip (``gathered_topk``'s keywords)."""

    def hook(state, bucket):
        corrected = bucket.buffer() + stored_residual(state, bucket)
        return gathered_topk(state, bucket, corrected, lambda residual: store_residual(state, bucket, residual), **slip)

    return hook


def topk_hook_without_memory(state, bucket):  # plausible and wrong: forgets to update the residual
    corrected = bucket.buffer() + stored_residual(state, bucket)
    return gathered_topk(state, bucket, corrected, lambda residual: None)


def sign_hook_mean_of_signs(state, bucket):  # plausible and wrong: mean(scale) x mean(sign)
    world = dist.get_world_size()
    grad = bucket.buffer()
    corrected = grad + stored_residual(state, bucket)
    scale = corrected.abs().mean().reshape(1)
    signs = torch.where(corrected >= 0, 1, -1).to(torch.int8)
    store_residual(state, bucket, corrected - scale * signs)
    gathered_signs = [torch.empty_like(signs) for _ in range(world)]
    gathered_scales = [torch.empty_like(scale) for _ in range(world)]
    dist.all_gather(gathered_signs, signs)
    dist.all_gather(gathered_scales, scale)
    grad.copy_(sum(gathered_scales) / world * sum(g.float() for g in gathered_signs) / world)
    future = torch.futures.Future()
    future.set_result(grad)
    return future


def topk_hook_always_feeding_back(state, bucket):  # plausible and wrong: ignores state["error_feedback"]
    return compressing_hooks.topk_ef_hook({**state, "error_feedback": True}, bucket)


@pytest.mark.parametrize(
    "attempt, hint",
    [
        (topk_hook_without_memory, "look at the residual"),
        (topk_by_bucket_index, "DDP rebuilt its buckets after step 0"),
        (topk_one_residual, "DDP rebuilt its buckets after step 0"),
        (topk_hook_always_feeding_back, "with error_feedback=False"),
        (topk_hook_variant(gather=False), "the ranks disagree"),
        (topk_hook_variant(dense=True), "the whole float32 bucket"),
        (topk_hook_variant(index_dtype=torch.int32), "Yours sends less"),
        (topk_hook_variant(divide=False), "already at step 0"),
        (topk_k_of_the_mlp, "on the digits CNN in three buckets (model='cnn', bucket_cap_mb=0.01): your hook sends"),
    ],
    ids=[
        "no_memory",
        "by_bucket_index",
        "one_residual",
        "ignores_the_switch",
        "no_gather",
        "dense_allreduce",
        "int32_indices",
        "no_divide",
        "k_of_the_mlp",
    ],
)
def test_topk_hook_wrong_answers_get_their_own_hint(attempt, hint, cluster):
    outcome = compressing_hooks.check_topk_ef_hook(attempt, cluster=cluster, steps=3)
    assert outcome.status == WRONG and hint in outcome.message, outcome.message


def sign_hook_variant(
    *,
    gather=True,
    residual=True,
    sign_dtype=torch.int8,
    send_scales=True,
    by_bucket_index=False,
    mean_over=None,
    world=None,
):
    """The reference EF-SignSGD hook with one slip."""

    def hook(state, bucket):
        ranks = world or dist.get_world_size()  # world: a number written where the world size belongs
        grad = bucket.buffer()
        if by_bucket_index:  # the first reference: wrong after DDP's rebuild
            corrected = grad + state["residuals"].get(bucket.index(), 0)
        else:
            corrected = grad + stored_residual(state, bucket)
        # mean_over: the mean |c| over a hard-coded count of entries (the MLP's), right on one bucket only
        scale = (corrected.abs().mean() if mean_over is None else corrected.abs().sum() / mean_over).reshape(1)
        signs = torch.where(corrected >= 0, 1, -1).to(sign_dtype)
        if residual and by_bucket_index:
            state["residuals"][bucket.index()] = corrected - scale * signs
        elif residual:
            store_residual(state, bucket, corrected - scale * signs)
        if not gather:
            grad.copy_(scale * signs)
        else:
            size = dist.get_world_size()
            gathered_signs = [torch.empty_like(signs) for _ in range(size)]
            dist.all_gather(gathered_signs, signs)
            scales = [torch.ones_like(scale) for _ in range(size)]
            if send_scales:
                dist.all_gather(scales, scale)
            grad.copy_(sum(s * g for s, g in zip(scales, gathered_signs)) / ranks)
        future = torch.futures.Future()
        future.set_result(grad)
        return future

    return hook


@pytest.mark.parametrize(
    "attempt, hint",
    [
        (sign_hook_mean_of_signs, "already at step 0"),
        (sign_hook_variant(residual=False), "look at the residual"),
        (sign_hook_variant(gather=False), "the ranks disagree"),
        (sign_hook_variant(sign_dtype=torch.float32), "Yours sends more"),
        (sign_hook_variant(send_scales=False), "Yours sends less"),
        (sign_hook_variant(by_bucket_index=True), "DDP rebuilt its buckets after step 0"),
        (sign_hook_variant(mean_over=9610), "on the digits CNN in three buckets (model='cnn', bucket_cap_mb=0.01)"),
    ],
    ids=["mean_of_signs", "no_memory", "no_gather", "float32_signs", "no_scales", "by_bucket_index", "mean_over_mlp"],
)
def test_sign_hook_wrong_answers_get_their_own_hint(attempt, hint, cluster):
    outcome = compressing_hooks.check_sign_ef_hook(attempt, cluster=cluster, steps=3)
    assert outcome.status == WRONG and hint in outcome.message, outcome.message


def test_the_topk_hook_check_runs_both_switches(cluster):
    wrong = compressing_hooks.check_topk_ef_hook(topk_hook_always_feeding_back, cluster=cluster)
    assert wrong.status == WRONG and "with error_feedback=False" in wrong.message


@pytest.fixture(scope="module")
def ranks(cluster):
    """2 ranks (the module's), 3 and 4: the hook checks' world sizes, one start each for the file."""
    with Cluster(world_size=3) as three, Cluster(world_size=4) as four:
        yield [cluster, three, four]


def test_topk_hook_check_on_its_three_paths(ranks):
    assert compressing_hooks.check_topk_ef_hook(topk_hook_stub, cluster=ranks).status == NOT_ATTEMPTED
    wrong = compressing_hooks.check_topk_ef_hook(topk_hook_without_memory, cluster=ranks)
    assert wrong.status == WRONG and "residual" in wrong.message
    right = compressing_hooks.check_topk_ef_hook(compressing_hooks.topk_ef_hook, cluster=ranks)
    assert right.status == RIGHT and "at 2, 3 and 4 ranks" in right.message, right.message


def test_sign_hook_check_catches_a_wrong_decoder(ranks):
    wrong = compressing_hooks.check_sign_ef_hook(sign_hook_mean_of_signs, cluster=ranks)
    assert wrong.status == WRONG and "step 0" in wrong.message
    right = compressing_hooks.check_sign_ef_hook(compressing_hooks.sign_ef_hook, cluster=ranks)
    assert right.status == RIGHT and "at 2, 3 and 4 ranks" in right.message, right.message


@pytest.mark.parametrize(
    "check, attempt",
    [
        (compressing_hooks.check_topk_ef_hook, topk_hook_variant(divide=2)),
        (compressing_hooks.check_sign_ef_hook, sign_hook_variant(world=2)),
    ],
    ids=["topk", "sign"],
)
def test_a_hook_that_divides_by_two_is_caught_at_three_ranks(check, attempt, ranks):
    """Issue 50: both passed when the checks ran at 2 ranks only."""
    outcome = check(attempt, cluster=ranks, steps=3)
    assert outcome.status == WRONG and "right at 2 ranks, but at 3:" in outcome.message, outcome.message
    assert "a 2 where the world size belongs" in outcome.message


def test_a_topk_hook_without_max_one_is_caught_on_a_ten_entry_bucket(cluster):
    """Issue 50: k = int(ratio * numel) is 0 on the MLP's 10-entry bias, a bucket of its own under SMALL_BUCKETS;
    no bucket under 100 entries was tried before."""
    outcome = compressing_hooks.check_topk_ef_hook(topk_hook_variant(at_least_one=False), cluster=cluster, steps=3)
    assert outcome.status == WRONG and "one bucket per parameter" in outcome.message, outcome.message
    assert "k = max(1, int(ratio * numel))" in outcome.message


# -- predictions of notebook 7 ------------------------------------------------------------------------


def fake_run(rel_errors, cumulative):
    from types import SimpleNamespace

    import pandas as pd

    return SimpleNamespace(steps=pd.DataFrame({"rel_error": rel_errors, "cumulative_rel_error": cumulative}))


def test_ef_prediction_on_its_three_paths(capsys):
    with_ef, without_ef = fake_run([0.8, 1.2], [0.8, 0.5]), fake_run([0.8, 0.78], [0.8, 0.81])
    outcome = compressing_hooks.check_ef_prediction(None, with_ef, without_ef)
    assert outcome.status == NOT_ATTEMPTED and "no prediction made" in capsys.readouterr().out
    assert outcome.value == {"rel_error": "higher", "cumulative_rel_error": "lower"}
    # plausible and wrong: "error feedback makes everything more accurate"
    wrong = compressing_hooks.check_ef_prediction(
        {"rel_error": "lower", "cumulative_rel_error": "lower"}, with_ef, without_ef
    )
    assert wrong.status == WRONG and "rel_error" in wrong.message and "e_(t-1)" in wrong.message
    assert "higher" not in wrong.message.split("not yet")[1].split("?")[0]  # the hint asks, never answers
    wrong = compressing_hooks.check_ef_prediction(
        {"rel_error": "higher", "cumulative_rel_error": "higher"}, with_ef, without_ef
    )
    assert wrong.status == WRONG and "cumulative_rel_error" in wrong.message
    both = compressing_hooks.check_ef_prediction(
        {"rel_error": "lower", "cumulative_rel_error": "higher"}, with_ef, without_ef
    )
    assert both.status == WRONG and "not yet for both metrics" in both.message
    for malformed in ({"rel_error": "higher"}, {"rel_error": "higher", "cumulative_rel_error": "lower", "x": 1}):
        outcome = compressing_hooks.check_ef_prediction(malformed, with_ef, without_ef)
        assert outcome.status == WRONG and "a dict with the keys" in outcome.message
    not_a_string = compressing_hooks.check_ef_prediction(
        {"rel_error": True, "cumulative_rel_error": "lower"}, with_ef, without_ef
    )
    assert not_a_string.status == WRONG and "got True" in not_a_string.message
    malformed = compressing_hooks.check_ef_prediction("lower", with_ef, without_ef)
    assert malformed.status == WRONG and "a dict with the keys" in malformed.message
    typo = compressing_hooks.check_ef_prediction(
        {"rel_error": "up", "cumulative_rel_error": "lower"}, with_ef, without_ef
    )
    assert typo.status == WRONG and "'higher' or 'lower'" in typo.message
    right = compressing_hooks.check_ef_prediction(
        {"rel_error": "higher", "cumulative_rel_error": "lower"}, with_ef, without_ef
    )
    assert right.status == RIGHT and "e_T" in right.message


def test_ef_prediction_follows_the_measurement_not_a_fixed_answer():
    with_ef, without_ef = fake_run([0.5, 0.5], [0.9, 0.9]), fake_run([0.8, 0.8], [0.4, 0.4])
    outcome = compressing_hooks.check_ef_prediction(None, with_ef, without_ef)
    assert outcome.value == {"rel_error": "lower", "cumulative_rel_error": "higher"}


# -- exercise 5 of notebook 7: the generator a stochastic-rounding hook draws from ------------------------


def generator_stub(seed, rank, step, bucket_index):
    raise NotImplementedError


def global_seed_only(seed, rank, step, bucket_index):  # what a training script seeds: the same on every rank
    return torch.Generator().manual_seed(seed)


def unseeded(seed, rank, step, bucket_index):
    return torch.Generator()


def global_generator(seed, rank, step, bucket_index):  # no generator of its own: torch.rand(..., generator=None)
    return None


def reseeds_the_global_one(seed, rank, step, bucket_index):
    torch.manual_seed(hash((seed, rank, step, bucket_index)) % 2**63)
    return torch.default_generator


def from_os_entropy(seed, rank, step, bucket_index):
    generator = torch.Generator()
    generator.seed()  # a non-deterministic seed
    return generator


def from_the_clock(seed, rank, step, bucket_index):
    import time

    return torch.Generator().manual_seed(time.time_ns() + rank)


def rank_but_not_step(seed, rank, step, bucket_index):
    return torch.Generator().manual_seed(1000 * seed + rank)


def no_bucket(seed, rank, step, bucket_index):
    return torch.Generator().manual_seed(hash((seed, rank, step)) % 2**63)


def added_up(seed, rank, step, bucket_index):  # rank 1 at step 0 collides with rank 0 at step 1
    return torch.Generator().manual_seed(seed + rank + step + bucket_index)


def packed_digits(seed, rank, step, bucket_index):  # rank 0's bucket 10 is rank 1's bucket 0 (GPT-2 has 13)
    return torch.Generator().manual_seed(seed * 100000 + step * 100 + rank * 10 + bucket_index)


def ignores_the_seed(seed, rank, step, bucket_index):
    return torch.Generator().manual_seed(hash((rank, step, bucket_index)) % 2**63)


def also_seeds_the_global_one(seed, rank, step, bucket_index):
    number = hash((seed, rank, step, bucket_index)) % 2**63
    torch.manual_seed(number)
    return torch.Generator().manual_seed(number)


def salted_str_hash(seed, rank, step, bucket_index):  # the same within a process tree, not after a restart
    return torch.Generator().manual_seed(hash(f"{seed}-{rank}-{step}-{bucket_index}") % 2**63)


def returns_the_seed(seed, rank, step, bucket_index):
    return hash((seed, rank, step, bucket_index))


def seed_sequence(seed, rank, step, bucket_index):  # NumPy's tool for independent streams
    import numpy as np

    state = np.random.SeedSequence([seed, rank, step, bucket_index]).generate_state(1, np.uint64)[0]
    return torch.Generator().manual_seed(int(state))


def digits_of_their_own(seed, rank, step, bucket_index):  # rank 1000 of seed 0 is rank 0 of seed 1
    return torch.Generator().manual_seed(((seed * 1000 + rank) * 100_000 + step) * 1000 + bucket_index)


def packed_wide_digits(seed, rank, step, bucket_index):  # right on the ranks' grid; rank 100 at step 0 is step 1
    return torch.Generator().manual_seed(seed * 10**9 + step * 10**4 + rank * 100 + bucket_index)


def tuple_hash_reordered(seed, rank, step, bucket_index):
    return torch.Generator().manual_seed(hash((bucket_index, step, rank, seed)) % 2**63)


def sixteen_buckets_a_step(seed, rank, step, bucket_index):  # issue 50: step 0's bucket 16 is step 1's bucket 0
    return torch.Generator().manual_seed(hash((seed, rank, 16 * step + bucket_index)) % 2**63)


def a_thousand_buckets_a_step(seed, rank, step, bucket_index):
    return torch.Generator().manual_seed(hash((seed, rank, 1000 * step + bucket_index)) % 2**63)


def bits_past_32(seed, rank, step, bucket_index):  # rank 4 sets bit 32, which the CPU generator drops
    return torch.Generator().manual_seed(((seed * 2**20 + step) * 2**14 + bucket_index) + rank * 2**30)


def test_the_planes_catch_packings_that_overlap_and_pass_chance_matches():
    """In the notebook's process, no ranks: what the planes add to the grids before them. Before issue 50 the check
    took sixteen_buckets_a_step and a_thousand_buckets_a_step as right (no bucket beyond 12 in the ranks' grid,
    none between 1 and 10 at the wide grid's steps)."""
    for packed, pair in [
        (sixteen_buckets_a_step, "(0, 0, 1, 0) and (0, 0, 0, 16)"),
        (a_thousand_buckets_a_step, "(0, 0, 1, 0) and (0, 0, 0, 1000)"),
        (bits_past_32, "and (0, 4, 0, 0) drew the same noise"),
    ]:
        said = compressing_hooks._plane_problem(packed)
        assert said is not None and pair in said and "no chance match" in said, (packed.__name__, said)
    assert compressing_hooks._wide_problem(sixteen_buckets_a_step) is None  # the grids before did not see it

    def chance(seed, rank, step, bucket_index):  # two points share a number, the next seed's do not
        if (seed, rank, step, bucket_index) in ((0, 0, 0, 5), (0, 0, 7, 0)):
            return torch.Generator().manual_seed(12345)
        return compressing_hooks.rounding_generator(seed, rank, step, bucket_index)

    assert compressing_hooks._plane_problem(chance) is None
    for right in (compressing_hooks.rounding_generator, seed_sequence, tuple_hash_reordered):
        assert compressing_hooks._plane_problem(right) is None, right.__name__


def seed_above_bit_31(seed, rank, step, bucket_index):  # the seed is in the number, where manual_seed drops it
    return torch.Generator().manual_seed(seed * 2**32 + hash((rank, step, bucket_index)) % 2**32)


def rank_above_bit_31(seed, rank, step, bucket_index):
    return torch.Generator().manual_seed(rank * 2**40 + hash((seed, step, bucket_index)) % 2**32)


def test_rounding_generator_not_attempted_hands_on_the_reference(cluster, capsys):
    outcome = compressing_hooks.check_rounding_generator(generator_stub, cluster=cluster)
    assert outcome.status == NOT_ATTEMPTED and outcome.value is compressing_hooks.rounding_generator
    assert "not attempted yet" in capsys.readouterr().out


@pytest.mark.parametrize(
    "attempt, hint",
    [
        (global_seed_only, "Mix the rank into the seed"),
        (unseeded, "unseeded torch.Generator()"),
        (global_generator, "torch's global generator"),
        (reseeds_the_global_one, "torch's global generator"),
        (from_os_entropy, "two runs with the same seed drew different noise"),
        (from_the_clock, "two runs with the same seed drew different noise"),
        (rank_but_not_step, "Mix the step into the seed"),
        (no_bucket, "Mix the bucket index into the seed"),
        (added_up, "seed + rank + step does"),
        (packed_digits, "drew the same noise: your seed gives both the same number"),
        (packed_wide_digits, "numbers packed side by side run into each other once one outgrows its digits"),
        (digits_of_their_own, "(0, 1000, 0, 0) and (1, 0, 0, 0) drew the same noise"),
        (ignores_the_seed, "seed 1 drew the same noise as seed 0"),
        (also_seeds_the_global_one, "changes torch's global generator"),
        (returns_the_seed, "return a torch.Generator"),
        (salted_str_hash, "hash() of a str or bytes, which Python salts anew in every process"),
        (sixteen_buckets_a_step, "(0, 0, 1, 0) and (0, 0, 0, 16) drew the same noise"),
        (seed_above_bit_31, "Mix the seed in (if it is in your number, it sits above bit 31"),
        (rank_above_bit_31, "Mix the rank into the seed (if it is in your number, it sits above bit 31"),
    ],
    ids=lambda x: x.__name__ if callable(x) else "",
)
def test_rounding_generator_wrong_attempts_get_their_hint(attempt, hint, cluster):
    outcome = compressing_hooks.check_rounding_generator(attempt, cluster=cluster)
    assert outcome.status == WRONG and hint in outcome.message, outcome.message
    assert outcome.value is compressing_hooks.rounding_generator


def test_a_generator_kept_between_calls_is_told_that_order_matters(cluster):
    streams = {}

    def kept_stream(seed, rank, step, bucket_index):  # one stream per rank, advancing call by call
        if (seed, rank) not in streams:
            streams[(seed, rank)] = torch.Generator().manual_seed(1000 * seed + rank)
        return streams[(seed, rank)]

    outcome = compressing_hooks.check_rounding_generator(kept_stream, cluster=cluster)
    assert outcome.status == WRONG and "A resumed run asks for step 10 first" in outcome.message


def test_rounding_generator_right_answers_pass(cluster):
    for right in (compressing_hooks.rounding_generator, seed_sequence, tuple_hash_reordered):
        outcome = compressing_hooks.check_rounding_generator(right, cluster=cluster)
        assert outcome.status == RIGHT and outcome.value is right, outcome.message


def test_the_wide_check_leaves_the_global_generator_alone():
    torch.manual_seed(3)
    before = torch.get_rng_state()
    assert compressing_hooks._wide_problem(packed_wide_digits) is not None
    assert compressing_hooks._wide_problem(compressing_hooks.rounding_generator) is None
    assert torch.equal(before, torch.get_rng_state())


def test_a_rounding_generator_that_raises_is_told_what_it_raised(cluster):
    def raises(seed, rank, step, bucket_index):
        return torch.Generator().manual_seed(seed / (rank - rank))

    outcome = compressing_hooks.check_rounding_generator(raises, cluster=cluster)
    assert outcome.status == WRONG and "your code raised ZeroDivisionError" in outcome.message


def test_the_world_size_loop_says_where_a_problem_showed():
    """checking.first_problem_by_world_size on stand-in Clusters (only their world_size is read): no ranks start."""
    from types import SimpleNamespace

    from commhooks_lab.exercises.checking import first_problem_by_world_size

    given = [SimpleNamespace(world_size=w) for w in (2, 3, 4)]
    seen = []

    def wrong_from(first_wrong):
        def problem_at(ranks):
            seen.append(ranks.world_size)
            return "not the mean." if ranks.world_size >= first_wrong else None

        return problem_at

    assert first_problem_by_world_size(wrong_from(5), given) is None and seen == [2, 3, 4]
    assert first_problem_by_world_size(wrong_from(2), given) == "not the mean."  # as the 2-rank checks said it
    said = first_problem_by_world_size(wrong_from(3), given)
    assert said.startswith("right at 2 ranks, but at 3: not the mean.") and "a 2 where the world size" in said
    assert first_problem_by_world_size(wrong_from(4), given) == "at 4 ranks: not the mean."
    assert first_problem_by_world_size(wrong_from(3), given[1:], world_sizes=(3, 4)) == "not the mean."


def test_a_world_size_not_given_gets_ranks_started_for_it_and_stopped():
    """Only a 2-rank cluster given: the 3-rank try runs on fresh ranks (through the launcher's Ranks), gone after."""
    from types import SimpleNamespace

    from commhooks_lab.exercises.checking import first_problem_by_world_size

    seen = []

    def problem_at(ranks):
        seen.append((ranks.world_size, ranks.run(lambda ctx: ctx.world_size)))
        return None

    assert first_problem_by_world_size(problem_at, SimpleNamespace(world_size=2, run=lambda f: [2, 2]), (2, 3)) is None
    assert seen == [(2, [2, 2]), (3, [3, 3, 3])]  # no_leftover_processes: the fresh ranks are stopped
