"""Issue 53, item 1: one checked value says which ranks a run needs, and one place decides where they come from."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

import commhooks_lab as lab
from commhooks_lab import ExperimentConfig
from commhooks_lab.launcher import Cluster, Ranks, RankSpec, netns_switch, session
from commhooks_lab.launcher.link_spec import as_link
from commhooks_lab.launcher.options import DEFAULT_TIMEOUT_S


def test_a_spec_is_checked_once_and_holds_the_parsed_link(monkeypatch):
    monkeypatch.setattr(netns_switch, "why_unavailable", lambda: None)  # links are checked, not built, here
    spec = RankSpec(2, link="100Mbit")
    assert spec.link == as_link("100mbit") and spec.backend == "gloo" and spec.timeout_s == DEFAULT_TIMEOUT_S
    assert spec == RankSpec(2, "gloo", DEFAULT_TIMEOUT_S, as_link("100mbit"))  # the same ranks, however written
    assert hash(spec) == hash(RankSpec(2, link=as_link("100mbit")))
    assert pickle.loads(pickle.dumps(spec)) == spec  # what each rank receives
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.world_size = 4  # type: ignore[misc]
    assert spec.replace(world_size=3).world_size == 3
    assert spec.describe() == "2 ranks behind 100mbit links"


@pytest.mark.parametrize(
    "options, says",
    [
        ({"world_size": 0}, "world_size must be at least 1, got 0"),
        ({"world_size": 2.0}, "world_size must be a positive int"),
        ({"timeout_s": 0.5}, "timeout_s=0.5 is shorter than the ranks can meet in"),
        ({"backend": "mpi"}, "unknown backend 'mpi'"),
        ({"start_method": "teleport"}, "unknown start_method 'teleport'"),
        ({"link": 100}, "a bare number does not say bits or bytes"),
        ({"link": "100mbps"}, "'mbps' means bytes per second"),
        ({"link": "1gbit", "start_method": "spawn"}, "needs start_method='forkserver'"),
    ],
)
def test_a_wrong_option_is_refused_with_the_same_message_everywhere(options, says, monkeypatch):
    """The spec, a Cluster and a config say the same thing: one check writes it."""
    monkeypatch.setattr(netns_switch, "why_unavailable", lambda: None)
    with pytest.raises((ValueError, TypeError), match=says):
        RankSpec(**options)
    with pytest.raises((ValueError, TypeError), match=says):
        Cluster(**options)
    if "start_method" not in options:  # a config has none: the lab picks it
        with pytest.raises((ValueError, TypeError), match=says):
            ExperimentConfig(**options).check()


def test_a_cluster_built_from_options_or_from_a_spec_is_the_same(cluster):
    assert isinstance(cluster.spec, RankSpec) and cluster.spec == RankSpec(2)
    assert (cluster.world_size, cluster.backend, cluster.spec.link) == (2, "gloo", None)
    with pytest.raises(TypeError, match="pass a RankSpec or the options"):
        Cluster(RankSpec(2), timeout_s=45)


def test_ranks_check_your_cluster_against_the_spec(cluster):
    with Ranks(cluster) as ranks:
        assert ranks(RankSpec(2)) is cluster
        with pytest.raises(ValueError, match="this Cluster has 2 ranks but the config asks for world_size=3"):
            ranks(RankSpec(3))
    assert cluster.alive, "Ranks never closes your cluster"
    with pytest.raises(ValueError, match="either cluster= .* or fresh=True"):
        Ranks(cluster, fresh=True)


def test_fresh_ranks_are_one_set_per_spec_and_stop_at_the_end():
    with Ranks(fresh=True) as ranks:
        first = ranks(RankSpec(2))
        assert ranks(RankSpec(2)) is first and first not in session.active()
    assert not first.alive


def test_the_session_keys_its_ranks_by_the_spec():
    warm = Ranks()(RankSpec(2))
    assert session.get_cluster(2) is warm and session.get_cluster(RankSpec(2)) is warm
    assert lab.run(hook="fp16", steps=2).env["start_method"] == warm.spec.start_method
    assert session.active() == [warm]


class _Reached(Exception):
    """Raised where the run would start its ranks' work: the test has seen what it wanted."""


def test_headroom_study_starts_its_ranks_behind_the_link_it_was_given(monkeypatch):
    """Before: headroom_study(link="100mbit") built Cluster(2), without the link, and its first run was refused
    ("this Cluster's ranks sit behind no link but the config asks for link='100mbit'"). No process starts here:
    links need user namespaces, so the spec the study's ranks were made from is what is checked."""
    from commhooks_lab.studies import convergence

    started: list[Cluster] = []
    monkeypatch.setattr(netns_switch, "why_unavailable", lambda: None)
    monkeypatch.setattr(Cluster, "start", lambda self: started.append(self))

    def run_serialized(self, payload, *, timeout_s=None, on_event=None):
        raise _Reached(self.spec)

    monkeypatch.setattr(Cluster, "run_serialized", run_serialized)
    with pytest.raises(_Reached) as reached:
        convergence.headroom_study(model="mlp", steps=2, warmup_steps=0, link="100mbit", world_size=3)
    (spec,) = reached.value.args
    assert spec == RankSpec(3, link="100mbit") and [c.spec for c in started] == [spec]


@pytest.mark.skipif(netns_switch.why_unavailable() is not None, reason="links need the lab's private network")
def test_headroom_study_runs_behind_a_link():
    from commhooks_lab.studies.convergence import headroom_study

    results = headroom_study(model="mlp", steps=2, warmup_steps=0, link="1gbit")
    assert all(r.config["link"] == "1gbit" for r in results)
    assert all(any("link:" in note for note in r.notes) for r in results)


def test_one_run_checks_its_launch_options_once(monkeypatch):
    """Before: config.check, the session, Cluster and run_serialized each checked them again (four times on a
    first run, three on a warm one)."""
    from commhooks_lab.launcher import cluster as cluster_module
    from commhooks_lab.launcher import rank_spec

    calls: list[str] = []

    def counted(name, check):
        def wrapper(*args, **kwargs):
            calls.append(name)
            return check(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(rank_spec, "check_launch_options", counted("launch", rank_spec.check_launch_options))
    monkeypatch.setattr(rank_spec, "check_link", counted("link", rank_spec.check_link))
    monkeypatch.setattr(cluster_module, "check_timeout", counted("timeout", cluster_module.check_timeout))
    lab.run(hook="fp16", steps=2)  # starts the session's ranks
    assert calls == ["launch", "link"]
    lab.compare(["allreduce", "fp16"], steps=2)  # on the warm ranks: each config checked once, nothing else
    assert calls == ["launch", "link"] * 3
