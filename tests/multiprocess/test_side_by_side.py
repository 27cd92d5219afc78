"""Runs shared out over two sets of ranks give the results one set gives, in the same order; the first error
stops the handing out; bad input is refused before any rank starts."""

import _bad_hooks
import pytest

import commhooks_lab as lab
from commhooks_lab.studies import convergence_study, power_sgd
from commhooks_lab.studies.side_by_side import compare_side_by_side, ranks_side_by_side

LINEUP = ["allreduce", power_sgd(1), "topk[ratio=0.1]"]


def counting_runs(monkeypatch, cluster, counts: list) -> None:
    """Count the runs a cluster is handed (one ``run_serialized`` per run)."""
    real = cluster.run_serialized

    def run_serialized(payload, **kwargs):
        counts.append(cluster)
        return real(payload, **kwargs)

    monkeypatch.setattr(cluster, "run_serialized", run_serialized)


def test_a_study_side_by_side_gives_the_one_after_another_results_in_order(cluster):
    together = convergence_study(seeds=(0, 1), steps=4, eval_every=2, model="mlp", lineup=LINEUP, cluster=cluster,
                                 side_by_side=2)  # fmt: skip
    alone = [r for seed in (0, 1) for r in lab.compare(LINEUP, cluster=cluster, steps=4, eval_every=2, model="mlp",
                                                       seed=seed, measure=False)]  # fmt: skip
    assert [(r.name, r.config["seed"]) for r in together] == [(r.name, r.config["seed"]) for r in alone]
    assert [r.final["param_digests"] for r in together] == [r.final["param_digests"] for r in alone]
    assert [r.final["accuracy"] for r in together] == [r.final["accuracy"] for r in alone]
    assert len({r.final["param_digests"][0] for r in together}) == 6  # six different runs, not one repeated
    assert cluster.alive


def test_both_sets_of_ranks_take_runs_and_the_one_made_for_it_is_closed(cluster, monkeypatch):
    config = lab.ExperimentConfig(model="mlp", steps=2)
    with ranks_side_by_side(cluster, 2, config) as clusters:
        assert clusters[0] is cluster and set(clusters[1].pids).isdisjoint(cluster.pids)
        counts: list = []
        for c in clusters:
            counting_runs(monkeypatch, c, counts)
        results = compare_side_by_side(["allreduce"] * 8, clusters, model="mlp", steps=2, measure=False)
        assert len(results) == 8 and len({r.final["param_digests"][0] for r in results}) == 1  # one seed, one result
        assert {id(c) for c in counts} == {id(c) for c in clusters} and len(counts) == 8
    assert not clusters[1].alive and cluster.alive


def test_the_first_error_stops_the_handing_out_and_is_raised(cluster, monkeypatch):
    items = [{"hook": _bad_hooks.returns_the_tensor}] + ["allreduce"] * 40
    counts: list = []
    with ranks_side_by_side(cluster, 2, lab.ExperimentConfig()) as clusters:
        for c in clusters:
            counting_runs(monkeypatch, c, counts)
        with pytest.raises(lab.WorkerError, match="returned a Tensor .* not a torch.futures.Future"):
            compare_side_by_side(items, clusters, model="mlp", steps=2, measure=False)
    assert len(counts) < len(items)  # the runs after the failure were never started
    assert not clusters[1].alive


def test_bad_input_is_refused_before_any_rank_starts(cluster):
    with pytest.raises(ValueError, match="side_by_side must be a whole number of sets of ranks, 1 or more; got 0"):
        convergence_study(seeds=(0,), steps=2, model="mlp", lineup=["allreduce"], side_by_side=0)
    with pytest.raises(ValueError, match="either cluster= .* or fresh=True"):
        convergence_study(seeds=(0,), steps=2, lineup=["allreduce"], cluster=cluster, fresh=True, side_by_side=2)
    with pytest.raises(ValueError, match="at least one Cluster"):
        compare_side_by_side(["allreduce"], [])
    with pytest.raises(ValueError, match="at least one hook or config"):
        compare_side_by_side([], [cluster])
    with pytest.raises(ValueError, match="unknown hook 'fp61'"):
        compare_side_by_side(["allreduce", "fp61"], [cluster])
