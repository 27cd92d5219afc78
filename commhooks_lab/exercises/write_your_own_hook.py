"""Notebook 7's exercises: top-k of a tensor, a top-k hook with error feedback, EF-SignSGD, and the
random generator a stochastic-rounding hook draws its noise from.

No ``from __future__ import annotations`` here: DDP compares a hook's return annotation with
``torch.futures.Future[torch.Tensor]`` itself, and a string annotation would fail that check.

The hook checks run the learner's hook and the reference on the same data through the lab and
compare them step by step: same bytes, same error (to float32 rounding), all ranks agreeing.
"""

from typing import Any

import torch
import torch.distributed as dist

from ..hooks.contract import completed_future
from .checking import (
    NOT_ATTEMPTED,
    RIGHT,
    WORLD_SIZES,
    WRONG,
    Outcome,
    check_function,
    first_problem_by_world_size,
    listed,
    reference,
    run_beside_reference,
    say,
)

__all__ = [
    "check_ef_prediction",
    "check_rounding_generator",
    "check_sign_ef_hook",
    "check_topk",
    "check_topk_ef_hook",
    "rounding_generator",
    "sign_ef_hook",
    "sign_state",
    "topk",
    "topk_ef_hook",
    "topk_state",
]

# -- references -------------------------------------------------------------------------------------


@reference("topk")
def topk(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Values and indices of the k entries of x with the largest magnitude."""
    flat = x.reshape(-1)
    indices = flat.abs().topk(k).indices
    return flat[indices], indices


@reference("topk_ef_hook")
def topk_ef_hook(state: dict, bucket) -> torch.futures.Future[torch.Tensor]:
    """Top-k with error feedback: send the k largest of (gradient + residual), keep the rest.

    ``state``: {"ratio": 0.01, "error_feedback": True, "residuals": {}}. The residuals are kept per parameter:
    DDP rebuilds its buckets after step 0, so a bucket's index does not name the same entries at every step.
    """
    world = dist.get_world_size()
    grad = bucket.buffer()
    params = bucket.parameters()
    residual = torch.cat([state["residuals"].get(p, torch.zeros(p.numel())) for p in params])
    corrected = grad + residual
    k = max(1, int(state["ratio"] * grad.numel()))
    values, indices = topk(corrected, k)
    if state.get("error_feedback", True):
        sent = torch.zeros_like(corrected)
        sent[indices] = values
        state["residuals"].update(zip(params, (corrected - sent).split([p.numel() for p in params])))
    gathered_values = [torch.empty_like(values) for _ in range(world)]
    gathered_indices = [torch.empty_like(indices) for _ in range(world)]
    dist.all_gather(gathered_values, values)
    dist.all_gather(gathered_indices, indices)
    grad.zero_()
    for v, i in zip(gathered_values, gathered_indices):
        grad.index_add_(0, i, v)
    grad.div_(world)
    return completed_future(grad)


@reference("sign_ef_hook")
def sign_ef_hook(state: dict, bucket) -> torch.futures.Future[torch.Tensor]:
    """EF-SignSGD: send sign(gradient + residual) and one scale, mean |.|; keep what the signs missed.

    ``state``: {"residuals": {}}, kept per parameter as in :func:`topk_ef_hook`.
    """
    world = dist.get_world_size()
    grad = bucket.buffer()
    params = bucket.parameters()
    corrected = grad + torch.cat([state["residuals"].get(p, torch.zeros(p.numel())) for p in params])
    scale = corrected.abs().mean().reshape(1)
    signs = torch.where(corrected >= 0, 1, -1).to(torch.int8)
    state["residuals"].update(zip(params, (corrected - scale * signs).split([p.numel() for p in params])))
    gathered_signs = [torch.empty_like(signs) for _ in range(world)]
    gathered_scales = [torch.empty_like(scale) for _ in range(world)]
    dist.all_gather(gathered_signs, signs)
    dist.all_gather(gathered_scales, scale)
    grad.copy_(sum(s * g for s, g in zip(gathered_scales, gathered_signs)) / world)
    return completed_future(grad)


def _by_bucket_index(hook):
    """``hook`` with its residuals kept under ``bucket.index()``, as a first attempt keeps them: DDP's rebuild
    after step 0 then adds step 0's residual to other parameters' entries (the check's known slip)."""

    def slipped(state: dict, bucket) -> torch.futures.Future[torch.Tensor]:
        stored = state["residuals"].get(bucket.index())
        params = bucket.parameters()
        own = {**state, "residuals": {}}
        if stored is not None and stored.numel() == bucket.buffer().numel():
            own["residuals"] = dict(zip(params, stored.split([p.numel() for p in params])))
        future = hook(own, bucket)
        if own["residuals"]:
            state["residuals"][bucket.index()] = torch.cat([own["residuals"][p] for p in params])
        return future

    return slipped


def topk_state(process_group: Any, ratio: float = 0.01, error_feedback: bool = True) -> dict:
    """The state the top-k exercise's hook gets on every rank."""
    return {"ratio": ratio, "error_feedback": error_feedback, "residuals": {}}


def sign_state(process_group: Any) -> dict:
    return {"residuals": {}}


# -- checks -----------------------------------------------------------------------------------------


#: (shape, k, seed) of the inputs the top-k check tries: the lab's flat buckets, another k, and a matrix.
_TOPK_CASES = (((1000,), 25, 7), ((1000,), 7, 8), ((40, 25), 12, 9))


def _verify_topk(fn) -> str | None:
    for shape, k, seed in _TOPK_CASES:
        x = torch.randn(*shape, generator=torch.Generator().manual_seed(seed))
        problem = _topk_problem(x, k, *fn(x.clone(), k))
        if problem:
            return problem
    return None


def _topk_problem(x: torch.Tensor, k: int, values, indices) -> str | None:
    call = f"topk(x, {k}) on x of shape {tuple(x.shape)}"
    values, indices = torch.as_tensor(values), torch.as_tensor(indices)
    if x.dim() > 1 and (values.dim() > 1 or indices.dim() > 1):
        return (
            f"{call} returned values of shape {tuple(values.shape)}: Tensor.topk works along the last dimension, "
            "k per row. Flatten x first (x.reshape(-1)); the indices are positions in the flattened tensor."
        )
    if len(values) != k or len(indices) != k:
        fixed = " Use the k argument, not a fixed number." if len(values) == len(indices) == 25 else ""
        return f"{call}: expected {k} values and {k} indices, got {len(values)} and {len(indices)}.{fixed}"
    flat = x.reshape(-1)
    kept = indices.long()
    if not torch.equal(flat[kept], values):
        if torch.equal(flat[kept].abs(), values):
            return "values[i] must equal x[indices[i]]: send the signed value, not its magnitude."
        return f"{call}: values[i] must equal x.reshape(-1)[indices[i]], the entry at that position, signed."
    rest = torch.ones_like(flat, dtype=torch.bool)
    rest[kept] = False
    if bool(flat[kept].abs().min() > flat[rest].abs().max()):
        return None
    if torch.equal(kept.sort().values, torch.arange(k)):
        return f"{call}: you kept the first {k} entries; choose the k entries by their magnitude."
    if bool(flat[kept].abs().max() <= flat[rest].abs().min()):
        return (
            f"{call}: you kept the {k} smallest magnitudes. Keep the largest: sort in descending order, or use "
            "Tensor.topk's default (largest=True)."
        )
    return "a dropped entry is larger in magnitude than a kept one: rank the entries by x.abs(), not by x."


def check_topk(attempt) -> Outcome:
    """``topk(x, k) -> (values, indices)`` keeps exactly the k largest magnitudes, on a vector with k = 25 and
    k = 7 and on a matrix (flattened, as the exercise says).

    Wrong answers it recognises, each told by its own hint: ranked by signed value ("rank the entries by x.abs()");
    the magnitudes sent instead of the values ("signed value"); the smallest magnitudes ("smallest magnitudes");
    the first k entries, a hard-coded slice ("first"); a hard-coded k = 25, right on the first case only ("Use the
    k argument"); another count ("expected"); k per row of a matrix, right on vectors only ("Flatten x first");
    values that are not the entries at the indices ("the entry at that position").
    """
    return check_function("topk", attempt, _verify_topk, "25 values at their indices, the 25 largest magnitudes.")


#: The second case every hook check runs: the digits CNN, which DDP's rebuild after step 0 splits into three
#: buckets (notebook 2), where the MLP travels in one.
MULTI_BUCKET: dict[str, Any] = {"model": "cnn", "bucket_cap_mb": 0.01}
_ON_MULTI_BUCKET = "on the digits CNN in three buckets (model='cnn', bucket_cap_mb=0.01): "
#: The third case: the MLP with a 16-byte cap, so that every parameter travels in a bucket of its own from step 1
#: (DDP's rebuild), its 10-entry output bias among them: under the 100 entries from which ratio 0.01 keeps one.
SMALL_BUCKETS: dict[str, Any] = {"bucket_cap_mb": 16 / 2**20}
_ON_SMALL_BUCKETS = "on the MLP with one bucket per parameter (bucket_cap_mb=16 / 2**20), its 10-entry bias alone: "
_KEEP_ONE = (
    "Yours sends less: 0.01 x 10 entries is 0.1, and int() makes it 0. Keep at least one entry, "
    "k = max(1, int(ratio * numel)), or the bucket is never sent and its residual grows for ever."
)

_REBUILT = (
    "your residual does not follow the parameters. DDP rebuilt its buckets after step 0 (notebook 2), so at step 1 "
    "bucket 0 holds the parameters in another order. A residual kept under bucket.index(), or one for the whole "
    "model, lands on other entries: keep one per parameter."
)


def _first_difference(a, b) -> int | None:
    """The first step at which two runs' rel_error differ by more than float32 rounding, or None."""
    differs = (a["rel_error"] - b["rel_error"]).abs() > 1e-5 * b["rel_error"].abs().clip(lower=1e-3)
    return int(a["step"][differs].iloc[0]) if differs.any() else None


def _compare_runs(
    attempt,
    ref,
    state_factory,
    steps: int,
    cluster,
    what: str,
    more: str = "",
    fewer: str = "",
    case: str = "",
    **changes: Any,
) -> str | None:
    """What differs between ``attempt`` and ``ref`` run on the same data, or None; ``case`` starts the hint."""
    problem = _runs_problem(attempt, ref, state_factory, steps, cluster, what, more, fewer, **changes)
    return None if problem is None else case + problem


def _runs_problem(attempt, ref, state_factory, steps, cluster, what, more, fewer, **changes) -> str | None:
    a, b = run_beside_reference(attempt, ref, state_factory, steps, cluster, **changes)
    if (a["rank_spread"] != 0).any():
        return "the ranks disagree after your hook: every rank must decode the same payloads the same way."
    if (a["payload_bytes"] != b["payload_bytes"]).any():
        mine, design = int(a["payload_bytes"].iloc[-1]), int(b["payload_bytes"].iloc[-1])
        said = (
            f"your hook sends {mine} B per step, the design sends {design} B: check the dtypes and sizes you "
            "all-gather."
        )
        if "uncompressed_bytes" in a and (a["payload_bytes"] == a["uncompressed_bytes"]).all():
            return (
                f"{said} Yours sends the whole float32 bucket, as a plain all-reduce does: all-gather only what the "
                "compressor keeps."
            )
        return f"{said} {more if mine > design else fewer}".rstrip()
    step = _first_difference(a, b)
    if step is not None:
        if step == 0:
            return (
                f"already at step 0 your gradient differs from {what} (rel_error {a['rel_error'].iloc[0]:.3g} vs "
                f"{b['rel_error'].iloc[0]:.3g}): check what you send and how you decode it."
            )
        slipped, _ = run_beside_reference(_by_bucket_index(ref), ref, state_factory, steps, cluster, **changes)
        if _first_difference(a, slipped) is None:
            return _REBUILT
        return (
            f"steps before {step} match, step {step} does not (rel_error {a['rel_error'].iloc[step]:.3g} vs "
            f"{b['rel_error'].iloc[step]:.3g}): look at the residual — added before compressing, updated after."
        )
    return None


_TOPK_BYTES = {
    "more": "Yours sends more: the values in float32 and the indices in int64, k of each, nothing else.",
    "fewer": "Yours sends less: the design's indices are int64 (what Tensor.topk returns), its values float32.",
}
_SIGN_BYTES = {
    "more": "Yours sends more: one int8 sign per entry and one float32 scale per rank, nothing else.",
    "fewer": "Yours sends less: every rank needs the other ranks' scales as well as their signs.",
}


def _compare_both_switches(fn, cluster, steps: int) -> str | None:
    """With error feedback (the default state), then without: a hook that ignores the switch fails the second;
    then error feedback on a model of several buckets, and on buckets too small for ratio x numel to reach 1."""
    what = "top-k of gradient + residual"
    problem = _compare_runs(fn, topk_ef_hook, topk_state, steps, cluster, what, **_TOPK_BYTES)
    if problem is None:
        problem = _compare_runs(
            fn, topk_ef_hook, topk_state, steps, cluster, "top-k of the gradient alone", **_TOPK_BYTES,
            state_options={"error_feedback": False},
        )  # fmt: skip
        if problem is not None:
            problem = f"with error_feedback=False, {problem} Keep no residual when state['error_feedback'] is False."
    if problem is None:
        problem = _compare_runs(
            fn, topk_ef_hook, topk_state, steps, cluster, what, **_TOPK_BYTES, case=_ON_MULTI_BUCKET, **MULTI_BUCKET
        )
    return problem or _on_small_buckets(fn, topk_ef_hook, topk_state, cluster, what, _TOPK_BYTES["more"], _KEEP_ONE)


def _on_small_buckets(fn, ref, state_factory, cluster, what: str, more: str, fewer: str) -> str | None:
    """Two steps on buckets of one parameter each (DDP's rebuild comes after step 0), on ``cluster``'s ranks: the
    case every world size runs, so that it is short."""
    return _compare_runs(
        fn, ref, state_factory, 2, cluster, what, more, fewer, case=_ON_SMALL_BUCKETS, world_size=cluster.world_size,
        **SMALL_BUCKETS,
    )  # fmt: skip


def check_topk_ef_hook(attempt, cluster=None, steps: int = 6, world_sizes=WORLD_SIZES) -> Outcome:
    """Run your hook and the reference on the same data, error feedback on and off: same bytes, same error; then
    with error feedback on the digits CNN, which travels in three buckets after DDP's rebuild (MULTI_BUCKET), and on
    the MLP with one bucket per parameter (SMALL_BUCKETS), all at 2 ranks; then that last case at 3 and 4 ranks.

    ``cluster``: a Cluster, or several, used for the world sizes they have; the others get ranks started for them.

    Wrong answers it recognises, each told by its own hint: the residual never kept ("look at the residual");
    the residual kept under bucket.index(), or one for all buckets, which DDP's rebuild after step 0 puts on other
    entries ("DDP rebuilt its buckets"); state["error_feedback"] ignored ("with error_feedback=False"); no
    all-gather, each rank decoding its own ("the ranks disagree"); the dense bucket all-reduced ("the whole float32
    bucket"); int32 indices ("Yours sends less"); extra payload ("Yours sends more"); a wrong decode, not dividing
    by W say ("already at step 0"); k hard-coded from the MLP's one bucket, right on the MLP only ("on the digits
    CNN in three buckets"); k = int(ratio * numel) without max(1, .), 0 on the 10-entry bucket ("Keep at least
    one entry"); a division by 2, not by the world size ("right at 2 ranks, but at 3").
    """

    def verify(fn) -> str | None:
        def at(ranks) -> str | None:
            if ranks.world_size == world_sizes[0]:
                return _compare_both_switches(fn, ranks, steps)
            return _on_small_buckets(fn, topk_ef_hook, topk_state, ranks, "top-k of gradient + residual",
                                     _TOPK_BYTES["more"], _KEEP_ONE)  # fmt: skip

        return first_problem_by_world_size(at, cluster, world_sizes)

    return check_function(
        "topk_ef_hook",
        attempt,
        verify,
        f"Same bytes and the same error as the reference at every one of {steps} steps, error feedback on and off, "
        f"on one bucket, three, and one per parameter; at {listed(world_sizes)} ranks; the ranks agree.",
    )


def check_sign_ef_hook(attempt, cluster=None, steps: int = 6, world_sizes=WORLD_SIZES) -> Outcome:
    """Run your EF-SignSGD hook and the reference on the same data: same bytes, same error, the ranks agreeing;
    on the MLP (one bucket), then on the digits CNN (three buckets after DDP's rebuild, MULTI_BUCKET), then on the
    MLP with one bucket per parameter (SMALL_BUCKETS), all at 2 ranks; then that last case at 3 and 4 ranks.

    ``cluster``: a Cluster, or several, used for the world sizes they have; the others get ranks started for them.

    Wrong answers it recognises, each told by its own hint: the mean of the scales times the mean of the signs
    ("already at step 0"); the residual never kept ("look at the residual"); the residual kept under
    bucket.index(), or one for all buckets ("DDP rebuilt its buckets"); each rank decoding its own signs ("the
    ranks disagree"); signs sent as float32 ("Yours sends more"); the scales not sent ("Yours sends less"); the
    scale divided by the MLP's 9,610 entries, right on the MLP only ("on the digits CNN in three buckets"); a
    division by 2, not by the world size ("right at 2 ranks, but at 3").
    """
    what = "mean|c| x sign(c)"

    def at(fn, ranks) -> str | None:
        if ranks.world_size == world_sizes[0]:
            problem = _compare_runs(fn, sign_ef_hook, sign_state, steps, ranks, what, **_SIGN_BYTES) or _compare_runs(
                fn, sign_ef_hook, sign_state, steps, ranks, what, **_SIGN_BYTES, case=_ON_MULTI_BUCKET, **MULTI_BUCKET
            )
            if problem is not None:
                return problem
        return _on_small_buckets(fn, sign_ef_hook, sign_state, ranks, what, **_SIGN_BYTES)

    return check_function(
        "sign_ef_hook",
        attempt,
        lambda fn: first_problem_by_world_size(lambda ranks: at(fn, ranks), cluster, world_sizes),
        f"Same bytes and the same error as the reference at every one of {steps} steps, on one bucket, three, and "
        f"one per parameter; at {listed(world_sizes)} ranks; the ranks agree.",
    )


HIGHER_OR_LOWER = ("higher", "lower")
EF_METRICS = ("rel_error", "cumulative_rel_error")


def _ef_answer(with_ef, without_ef) -> dict:
    """With error feedback vs without: mean per-step rel_error and the last step's cumulative_rel_error."""
    per_step = with_ef.steps["rel_error"].mean() > without_ef.steps["rel_error"].mean()
    summed = with_ef.steps["cumulative_rel_error"].iloc[-1] > without_ef.steps["cumulative_rel_error"].iloc[-1]
    return {"rel_error": HIGHER_OR_LOWER[not per_step], "cumulative_rel_error": HIGHER_OR_LOWER[not summed]}


_EF_HINTS = {
    "rel_error": "rel_error compares h_t with this step's exact mean g_t. With error feedback, h_t = C(g_t + e_(t-1)): "
    "what does re-sending the old residual e_(t-1) do to the distance from g_t?",
    "cumulative_rel_error": "cumulative_rel_error compares the sums over steps. Add up h_t = C(c_t) = c_t - e_t "
    "with c_t = g_t + e_(t-1): which residuals are left in the sum? Without error feedback, where does what is "
    "dropped go?",
}


def check_ef_prediction(prediction: Any, with_ef, without_ef) -> Outcome:
    """A prediction {"rel_error": "higher"|"lower", "cumulative_rel_error": ...}: with error feedback vs without.

    Two metrics of two choices each: three wrong combinations, each told by its own hint (none says the answer):
    rel_error wrong ("error feedback makes everything more accurate": "not yet for rel_error"), cumulative_rel_error
    wrong ("not yet for cumulative_rel_error"), both wrong ("not yet for both metrics").

    Malformed answers get a clear message instead: not a dict with the two keys ("a dict with the keys"), a value
    other than the two strings ("'higher' or 'lower'": "up", True).
    """
    answer = _ef_answer(with_ef, without_ef)
    name = "ef_prediction"
    if prediction is None:
        return say(
            Outcome(
                NOT_ATTEMPTED,
                f"· {name}: no prediction made. Write one in the prediction cell, then compare it with the "
                "measurement above.",
                answer,
            )
        )
    if not isinstance(prediction, dict) or set(prediction) != set(EF_METRICS):
        return say(
            Outcome(
                WRONG,
                f"✗ {name}: write the prediction as a dict with the keys {list(EF_METRICS)}, each "
                f"{' or '.join(repr(v) for v in HIGHER_OR_LOWER)}.",
                answer,
            )
        )
    bad = [m for m in EF_METRICS if prediction[m] not in HIGHER_OR_LOWER]
    if bad:
        got = prediction[bad[0]]
        return say(Outcome(WRONG, f"✗ {name}: {bad[0]} must be 'higher' or 'lower', got {got!r}.", answer))
    wrong = [m for m in EF_METRICS if prediction[m] != answer[m]]
    if len(wrong) == len(EF_METRICS):
        hints = " Then: ".join(_EF_HINTS[m] for m in EF_METRICS)
        return say(Outcome(WRONG, f"✗ {name}: not yet for both metrics. {hints}", answer))
    if wrong:
        return say(Outcome(WRONG, f"✗ {name}: not yet for {wrong[0]}. {_EF_HINTS[wrong[0]]}", answer))
    return say(
        Outcome(
            RIGHT,
            f"✓ {name}: right. Each step's h_t carries old residuals, so it is further from g_t; summed over steps "
            "only the last residual is missing (sum of h_t = sum of g_t - e_T), while without error feedback every "
            "dropped entry is lost for good.",
            answer,
        )
    )


# -- exercise 5: noise of each rank's own, new every step, the same in every run -----------------------------

#: The grid the check asks for: two seeds, every rank, steps and buckets both small and large (GPT-2 has 13 buckets,
#: and a run thousands of steps: a seed made of digits, such as seed*100000 + step*100 + rank*10 + bucket, gives
#: rank 0's bucket 10 rank 1's bucket 0), four draws per generator.
NOISE_SEEDS, NOISE_STEPS, NOISE_BUCKETS, NOISE_DRAWS = (0, 1), (0, 1, 2, 3, 100, 1000), (0, 1, 10, 12), 4
#: Numbers a large job reaches, asked for in the notebook's own process (the function is pure): a thousand ranks,
#: a million steps, a hundred buckets. Digits packed side by side, as seed*10**9 + step*10**4 + rank*100 + bucket,
#: run into each other there (rank 100 at step 0 is rank 0 at step 1).
WIDE_RANKS, WIDE_STEPS, WIDE_BUCKETS = (0, 1, 100, 1000), (0, 1, 100, 10**4, 10**6), (0, 1, 10, 100)
#: How far each argument goes in a run the check stands for: ten thousand ranks, a million steps, a thousand buckets
#: (DDP's default 25 MiB buckets: a model of a billion float32 parameters fills about 150), seeds up to 10**4.
REACH = {"seed": 10**4, "rank": 10**4, "step": 10**6, "bucket": 1000}
#: The planes tried in the notebook's process: two arguments at a time, the others 0, one of the two in 0..3 and
#: the other in 0..255 and at round numbers up to its REACH. A seed packed as a*step + bucket gives (step 1,
#: bucket 0) and (step 0, bucket a) one number: a of 255 or less, or round, is within a plane. About 10,000 calls.
PLANE_SMALL, PLANE_DENSE = 4, 256


@reference("rounding_generator")
def rounding_generator(seed: int, rank: int, step: int, bucket_index: int) -> torch.Generator:
    """A generator for this rank's rounding noise in this bucket at this step: a pure function of the four.

    Python's hash of a tuple of ints is the same in every process (only str and bytes hashes are salted);
    manual_seed takes it modulo 2**63.
    """
    return torch.Generator().manual_seed(hash((seed, rank, step, bucket_index)) % 2**63)


#: Said where an argument seems left out: it may be in the number, above the bits the generator keeps.
_LOW_32 = (
    " (if it is in your number, it sits above bit 31: torch's CPU generator seeds from the number's low 32 bits "
    "alone, so multiply by 2**32 or more and it is gone)"
)


def _noise_grid(fn, seed: int, keys: list) -> dict:
    """Draws from ``fn(seed, rank, step, bucket)`` for each (step, bucket) in ``keys``, in that order, on this rank;
    torch's global generator seeded with ``seed`` first, as a reproducible training script seeds it."""
    rank = dist.get_rank()
    torch.manual_seed(seed)
    draws, kinds, touched = {}, set(), False
    for step, bucket in keys:
        before = torch.get_rng_state()
        generator = fn(seed, rank, step, bucket)
        touched |= not torch.equal(before, torch.get_rng_state())
        if generator is None or generator is torch.default_generator:
            kinds.add("global")
        elif not isinstance(generator, torch.Generator):
            return {"returned": f"{type(generator).__name__} {generator!r}"[:80]}
        else:
            kinds.add("unseeded" if generator.initial_seed() == torch.Generator().initial_seed() else "own")
        draws[(step, bucket)] = tuple(torch.rand(NOISE_DRAWS, generator=generator).tolist())
    return {"draws": draws, "kinds": kinds, "touched": touched}


def _noise_job(ctx, fn) -> dict:
    """Worker: every seed's grid in order, then in reverse order (a resumed run asks for a late step first)."""
    keys = [(step, bucket) for step in NOISE_STEPS for bucket in NOISE_BUCKETS]
    out: dict[Any, dict] = {}
    try:
        for seed in NOISE_SEEDS:
            out[seed] = _noise_grid(fn, seed, keys)
            out[(seed, "reversed")] = _noise_grid(fn, seed, keys[::-1])
    except NotImplementedError:
        return {"not_implemented": True}
    except Exception as exc:  # the learner's code raised: say what, in the notebook, not on the rank's stderr
        return {"raised": f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"}
    return out


def _run_noise_job(fn, cluster) -> list[dict]:
    if cluster is not None:
        return cluster.run(_noise_job, fn)
    from ..launcher import launch

    return launch(_noise_job, fn, world_size=2)


def _noise_problem(first: list[dict], second: list[dict]) -> str | None:
    """What is wrong with the noise two runs of ``_noise_job`` drew (each a list, one entry per rank), or None."""
    for ranks in (first, second):
        for got in ranks:
            if got.get("not_implemented"):
                raise NotImplementedError
            if "raised" in got:
                return f"your code raised {got['raised']}"
            for seed in NOISE_SEEDS:
                if "returned" in got[seed]:
                    return f"it returned {got[seed]['returned']}: return a torch.Generator to draw the noise from."
    seed = NOISE_SEEDS[0]
    if any(a[s]["draws"] != b[s]["draws"] for a, b in zip(first, second) for s in NOISE_SEEDS):
        return (
            "two runs with the same seed drew different noise: your seed comes from somewhere that changes from run "
            "to run (the clock, the OS's entropy: Generator.seed(), time.time_ns(); the process id; hash() of a "
            "str or bytes, which Python salts anew in every process). Build it from the four integers alone, so "
            "that a run can be repeated and a bug reproduced."
        )
    if any("global" in r[s]["kinds"] for r in first for s in NOISE_SEEDS):
        return (
            "it hands back torch's global generator (None or torch.default_generator), whose every draw shifts the "
            "training script's later ones (dropout, data order): return a torch.Generator() of the hook's own, "
            "seeded with manual_seed(...)."
        )
    if any(r[s]["draws"] != r[(s, "reversed")]["draws"] for r in first for s in NOISE_SEEDS):
        return (
            "asked for the same (rank, step, bucket) after other calls, it drew other noise: it depends on how often "
            "and in which order it was called (a generator kept and reused between calls?). A resumed run asks for "
            "step 10 first; make the noise a function of the four arguments alone."
        )
    draws = [r[seed]["draws"] for r in first]
    if all(d == draws[0] for d in draws):
        if any("unseeded" in r[seed]["kinds"] for r in first):
            return (
                "both ranks drew the same noise: an unseeded torch.Generator() starts from the same default seed in "
                "every process. Seed it, and with a number that differs from rank to rank."
            )
        return (
            "both ranks drew the same noise at every step: the ranks averaged identical roundings, so the average "
            f"is no less noisy than one rank's. Mix the rank into the seed{_LOW_32}."
        )
    keys = sorted(draws[0])
    if all(d[(step, bucket)] == d[(0, bucket)] for d in draws for step, bucket in keys):
        return (
            "every step drew the same noise as step 0, so an entry whose value barely changes rounds the same way "
            "every step: its rounding error repeats instead of averaging out over steps. Mix the step into the seed."
        )
    if all(d[(step, bucket)] == d[(step, 0)] for d in draws for step, bucket in keys):
        return (
            "bucket 1 drew the same noise as bucket 0 at every step: in a model with several buckets, entry i of "
            "every bucket would draw the same number. Mix the bucket index into the seed."
        )
    if all(a[NOISE_SEEDS[1]]["draws"] == a[seed]["draws"] for a in first):
        return f"seed 1 drew the same noise as seed 0: a run's seed must set the noise too. Mix the seed in{_LOW_32}."
    seen: dict[tuple, tuple] = {}
    for rank, r in enumerate(first):
        for s in NOISE_SEEDS:
            for (step, bucket), drawn in sorted(r[s]["draws"].items()):
                where = (s, rank, step, bucket)
                if drawn in seen:
                    other = seen[drawn]
                    return (
                        f"(seed, rank, step, bucket) = {other} and {where} drew the same noise: your seed gives both "
                        "the same number (seed + rank + step does, for instance). Combine the four so that different "
                        "ones never give the same seed."
                    )
                seen[drawn] = where
    if any(r[s]["touched"] for r in first for s in NOISE_SEEDS):
        return (
            "the noise is right, but the function changes torch's global generator (torch.manual_seed, or a draw "
            "from it): every later draw of the training script (dropout, data order) would then depend on the hook. "
            "Seed the generator you return, and only that one."
        )
    return None


def _wide_problem(fn) -> str | None:
    """Two (seed, rank, step, bucket) of WIDE_* that draw the same noise, said as a hint, or None.

    It runs in the calling process; torch's global generator is put back as it was.
    """
    saved = torch.get_rng_state()
    try:
        seen: dict[tuple, tuple] = {}
        for seed in NOISE_SEEDS:
            for rank in WIDE_RANKS:
                for step in WIDE_STEPS:
                    for bucket in WIDE_BUCKETS:
                        where = (seed, rank, step, bucket)
                        drawn = tuple(torch.rand(NOISE_DRAWS, generator=fn(*where)).tolist())
                        if drawn in seen:
                            return (
                                f"(seed, rank, step, bucket) = {seen[drawn]} and {where} drew the same noise. A large "
                                "job has a thousand ranks and runs a million steps, and numbers packed side by side "
                                "run into each other once one outgrows its digits. Combine the four so that "
                                "different ones never give the same seed."
                            )
                        seen[drawn] = where
    finally:
        torch.set_rng_state(saved)
    return None


def _plane_points() -> list[tuple[int, int, int, int]]:
    """(seed, rank, step, bucket) of every plane, each once, in a fixed order."""
    names = list(REACH)
    points: dict[tuple[int, int, int, int], None] = {}
    for small in range(4):
        for large in range(4):
            if small == large:
                continue
            reach = REACH[names[large]]
            far = {m * 10**e for m in (1, 2, 5) for e in range(7)} | {2**e for e in range(21)}
            for a in range(PLANE_SMALL):
                for b in sorted({*range(PLANE_DENSE), *far}):
                    if b <= reach:
                        point = [0, 0, 0, 0]
                        point[small], point[large] = a, b
                        points[(point[0], point[1], point[2], point[3])] = None
    return list(points)


def _plane_problem(fn) -> str | None:
    """Two (seed, rank, step, bucket) of the planes that draw the same noise, and draw it again one seed later,
    said as a hint; or None. A match that the next seed does not repeat is chance: torch's CPU generator seeds its
    Mersenne Twister from the low 32 bits of the number alone (MT19937RNGEngine.h, ``seed & 0xffffffff``), so among
    ten thousand numbers two can share them; a packing that overlaps repeats at every seed.

    It runs in the calling process; torch's global generator is put back as it was.
    """
    saved = torch.get_rng_state()

    def drawn(where: tuple) -> tuple:
        return tuple(torch.rand(NOISE_DRAWS, generator=fn(*where)).tolist())

    try:
        seen: dict[tuple, tuple] = {}
        for where in _plane_points():
            noise = drawn(where)
            other = seen.setdefault(noise, where)
            if other == where:
                continue
            later, other_later = ((p[0] + 1, *p[1:]) for p in (where, other))
            if drawn(later) != drawn(other_later):
                continue
            differ = [n for n, a, b in zip(REACH, where, other) if a != b]
            verb = "differs" if len(differ) == 1 else "differ"
            return (
                f"(seed, rank, step, bucket) = {other} and {where} drew the same noise, and so did {other_later} and "
                f"{later}: no chance match, your seed gives both one number whatever the seed. Their "
                f"{' and '.join(differ)} {verb}: something has less room in your number than a real run needs "
                "(16 * step + bucket runs into the next step at bucket 16; a run reaches "
                f"{REACH['rank']:,} ranks, {REACH['step']:,} steps and hundreds of buckets, and torch's CPU generator "
                "keeps only the low 32 bits of a seed). Mix the four so that every bit of each reaches those 32 (a "
                "tuple's hash does) rather than packing them side by side."
            )
    finally:
        torch.set_rng_state(saved)
    return None


def check_rounding_generator(attempt, cluster=None) -> Outcome:
    """``rounding_generator(seed, rank, step, bucket_index)``, called on two ranks in two runs: noise independent
    per rank, new every step and bucket, the same in every run.

    Wrong answers it recognises, each told by its own hint: the script's seed alone ("Mix the rank into the
    seed"); an unseeded torch.Generator() ("unseeded torch.Generator()"); None, torch.default_generator or a
    reseeded global generator ("torch's global generator"); the OS's entropy, the clock or a salted str hash
    ("two runs with the same seed drew different noise", "salts anew"); no step ("Mix the step into the seed");
    no bucket index ("Mix the bucket index into the seed"); the seed left out ("seed 1 drew the same noise as
    seed 0"); numbers added up, or packed in decimal digits that collide at bucket 10 ("your seed gives both the
    same number"); digits packed wider, seed*10**9 + step*10**4 + rank*100 + bucket say, that run into each other
    at a thousand ranks or a million steps ("outgrows its digits"); a step that moves the number by less than a
    model's bucket count, hash((seed, rank, 16 * step + bucket_index)) say, or a packing whose high bits the
    generator drops ("no chance match"); one generator kept between calls ("A resumed run asks for step 10
    first"); a side effect on the global generator ("changes torch's global generator"); not a generator ("return
    a torch.Generator").

    Ranks: two in the cluster's processes and two in new ones; ranks 2 to 10,000 are tried in the notebook's
    process. The function is pure and the world size is none of its arguments, so 3 and 4 ranks would repeat
    what ranks 0 to 3 of the planes try, at a second of starting ranks each.
    """

    def verify(fn) -> str | None:
        from ..launcher import launch

        first = _run_noise_job(fn, cluster)
        problem = _noise_problem(first, _run_noise_job(fn, cluster))
        if problem is not None:
            return problem
        # Then a run in new interpreters, as a rerun of the script would be: other PIDs, another hash() salt.
        problem = _noise_problem(first, launch(_noise_job, fn, world_size=2, start_method="spawn"))
        return problem if problem is not None else _wide_problem(fn) or _plane_problem(fn)

    return check_function(
        "rounding_generator",
        attempt,
        verify,
        "On two ranks, in two runs (the second in new processes): every (seed, rank, step, bucket) draws noise of "
        "its own, the same in both runs and whatever the order of the calls, and torch's global generator is left "
        "alone. The lab's compressors seed like yours (lab.compressors.Where.generator).",
    )
