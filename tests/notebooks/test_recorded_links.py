"""Where no link can be built the lessons' runs behind links are replayed from recordings, said to be so, and the
recordings stay those of the committed notebooks' code; everywhere else, a call behind a link is refused."""

import json

import nbformat
import pandas as pd
import pytest
from test_testing import failed_notebooks, nbval

from commhooks_lab.course import course_root
from commhooks_lab.launcher import isolation, netns_switch, notes
from commhooks_lab.launcher.netns_switch import NetworkUnavailableError
from commhooks_lab.result import Result
from commhooks_lab.studies import links, nodes, recorded
from commhooks_lab.studies import network as lab_network

CAUSE = "this machine allows no more user namespaces (user.max_user_namespaces is 0 or used up)"
WAY_OUT = "only the machine's owner can allow them"
HOOKS = {"allreduce": "allreduce"}
LINKS = ("unlimited", "100mbit")


@pytest.fixture
def refused(monkeypatch):
    """This machine refuses user namespaces (the probe's answer, as on a machine that does)."""
    facts = {"refused": CAUSE, "way_out": WAY_OUT, "netem": False}
    monkeypatch.setattr(netns_switch, "facts", lambda: facts)


def _timed() -> links.LinkTimes:
    link = {"link": "unlimited", "set_gbps": None, "wire_gbps": 3.1, "payload_gbps": 2.9, "alpha_us": 41.5,
            "world_size": 2}  # fmt: skip
    rows = [{"link": name, "hook": hook, "repeat": 0, "median_ms": 1 / 3 + i, "min_ms": 0.1, "max_ms": 9.0, "steps": 4}
            for i, (name, hook) in enumerate([(n, h) for n in LINKS for h in ("noop", "allreduce")])]  # fmt: skip
    traffic = {"allreduce_bytes": 4.5e6, "allgather_bytes": 0.0, "allreduce_calls": 1.0, "allgather_calls": 0.0,
               "overlaps_backward": True}  # fmt: skip
    return links.LinkTimes([link, {**link, "link": "100mbit", "set_gbps": 0.1}], pd.DataFrame(rows),
                           {"noop": traffic, "allreduce": traffic})  # fmt: skip


def _record(folder, monkeypatch, study: str, arguments: dict, data) -> None:
    """``folder`` holds one recording of ``study`` called with ``arguments``, as execute_notebooks installs it."""
    scratch = folder / "kept.json"
    monkeypatch.setenv(recorded.VARIABLE, str(scratch))
    recorded.keep(study, arguments, data)
    monkeypatch.delenv(recorded.VARIABLE)
    (folder / "recorded").mkdir()
    (folder / "recorded" / "nb.json").write_text(scratch.read_text())
    monkeypatch.setattr(recorded, "DIRECTORY", folder / "recorded")


def _arguments(**changes) -> dict:
    hooks = {links.BASE: links.BASE, **HOOKS}
    return dict(hooks=hooks, links=LINKS, model="wide", world_size=2, steps=10, repeats=1, steps_for=None,
                transfers=2, seconds=0.2, **changes)  # fmt: skip


def test_where_links_are_refused_time_hooks_replays_the_recorded_run_bit_for_bit_and_says_so(
    tmp_path, monkeypatch, refused
):
    timed = _timed()
    _record(tmp_path, monkeypatch, "time_hooks", _arguments(), timed.to_json())
    with pytest.warns(RuntimeWarning, match=r"links=\('unlimited', '100mbit'\) cannot be built here: this machine"):
        replayed = links.time_hooks(HOOKS, links=LINKS, steps=10, transfers=2, seconds=0.2)
    pd.testing.assert_frame_equal(replayed.times, timed.times)
    assert replayed.links == timed.links and replayed.traffics == timed.traffics
    pd.testing.assert_frame_equal(links.predict(replayed, {"allreduce": 0.0}), links.predict(timed, {"allreduce": 0}))


def test_a_call_nobody_recorded_is_refused_naming_every_link_it_asked_for(tmp_path, monkeypatch, refused):
    _record(tmp_path, monkeypatch, "time_hooks", _arguments(), _timed().to_json())
    with pytest.raises(NetworkUnavailableError, match=r"links=\('unlimited', '1gbit'\) cannot be built on this") as e:
        links.time_hooks(HOOKS, links=("unlimited", "1gbit"), steps=10, transfers=2, seconds=0.2)
    assert CAUSE in str(e.value) and WAY_OUT in str(e.value) and "no run of this call was recorded" in str(e.value)
    with pytest.raises(NetworkUnavailableError, match=r"link='10mbit' cannot be built on this machine"):
        links.race(["allreduce"], link="10mbit", seeds=(0,), steps=4)
    with pytest.raises(ValueError, match="not a rate"):  # a wrong spec is the learner's to fix, here too
        links.time_hooks(HOOKS, links=("unlimited", "fast"))


def _result(seed: int) -> Result:
    steps = pd.DataFrame({"step": [0, 1, 2], "loss": [2.0, 1.5, 1.25], "accuracy": [float("nan"), 0.5, 0.875],
                          "step_time_s": [0.1, 1 / 3, 0.2]})  # fmt: skip
    return Result(
        {"hook": "allreduce", "seed": seed}, steps, pd.DataFrame(), ["a note"], {"torch": "x"}, {"loss": 1.25}
    )


def test_where_links_are_refused_the_race_returns_the_recorded_results(tmp_path, monkeypatch, refused):
    runs = [_result(0), _result(1)]
    arguments = dict(hooks=["allreduce"], link="10mbit", seeds=[0, 1], steps=3, timing=True)
    _record(tmp_path, monkeypatch, "race", arguments, [r.to_json() for r in runs])
    with pytest.warns(RuntimeWarning, match="link='10mbit' cannot be built here"):
        raced = links.race(["allreduce"], link="10mbit", seeds=(0, 1), steps=3, timing=True)
    assert [r.config for r in raced] == [r.config for r in runs] and raced[1].notes == ["a note"]
    pd.testing.assert_frame_equal(raced[1].steps, runs[1].steps)
    pd.testing.assert_frame_equal(links.time_to_accuracy(raced, 0.8), links.time_to_accuracy(runs, 0.8))


def _node_times() -> nodes.NodeTimes:
    net = lab_network.TwoLevelNetwork(intra_alpha_us=50.0, intra_gbps=9.5, inter_alpha_us=80.0, inter_gbps=0.0097,
                                      nodes=2, ranks_per_node=2)  # fmt: skip
    times = pd.DataFrame([{"run": "noop", "api": "ddp", "hierarchical": False, "intra_bytes": 0.0, "inter_bytes": 0.0,
                           "median_ms": 1 / 3, "min_ms": 0.25, "max_ms": 2.0, "steps": 6, "retransmitted": 0.0},
                          {"run": "hierarchical", "api": "ddp", "hierarchical": True, "intra_bytes": 57660.0,
                           "inter_bytes": 38440.0, "median_ms": 33.5, "min_ms": 31.0, "max_ms": 40.0, "steps": 6,
                           "retransmitted": 0.01}])  # fmt: skip
    traffic = {"intra_bytes": 57660.0, "inter_bytes": 38440.0, "intra_calls": 2.0, "inter_allreduce_calls": 1.0,
               "inter_allgather_calls": 0.0, "hierarchical": True}  # fmt: skip
    collectives = pd.DataFrame([{"group": "world", "bytes": 4, "measured_ms": 1.4, "model_ms": 0.5}])
    return nodes.NodeTimes(net, "10mbit", times, {"hierarchical": traffic}, collectives)


def test_where_links_are_refused_the_nodes_study_replays_its_recorded_runs_and_says_so(tmp_path, monkeypatch, refused):
    timed = _node_times()
    arguments = dict(hooks={"noop": "noop", "hierarchical": "hierarchical"}, fsdp2={}, link="10mbit", nodes=2,
                     ranks_per_node=2, model="mlp", steps=8)  # fmt: skip
    _record(tmp_path, monkeypatch, "time_on_nodes", arguments, timed.to_json())
    with pytest.warns(RuntimeWarning, match=r"nodes=2, link='10mbit' cannot be built here: this machine"):
        replayed = nodes.time_on_nodes({"hierarchical": "hierarchical"}, link="10mbit")
    assert replayed.network == timed.network and replayed.traffics == timed.traffics
    pd.testing.assert_frame_equal(replayed.times, timed.times)
    pd.testing.assert_frame_equal(replayed.collectives, timed.collectives)
    model = nodes.model_table(replayed, {})
    assert model.loc["hierarchical", "model_ms"] == pytest.approx(1 / 3 + 1e3 * lab_network.two_level_seconds(
        timed.traffics["hierarchical"], timed.network))  # fmt: skip
    with pytest.raises(NetworkUnavailableError, match=r"nodes=2, link='100mbit' cannot be built on this machine"):
        nodes.time_on_nodes({"hierarchical": "hierarchical"}, link="100mbit")
    with pytest.raises(NetworkUnavailableError, match=r"link='100mbit' cannot be built on this machine"):
        nodes.hidden_shares({"mine": print}, link="100mbit")


def test_asked_for_the_recordings_a_study_replays_them_even_where_links_can_be_built(tmp_path, monkeypatch):
    """What the other-kernel-path check sets: no Cluster starts (a start would fail: there is none to start), and the
    note says why the run is a recording."""
    timed = _node_times()
    arguments = dict(hooks={"noop": "noop", "hierarchical": "hierarchical"}, fsdp2={}, link="10mbit", nodes=2,
                     ranks_per_node=2, model="mlp", steps=8)  # fmt: skip
    _record(tmp_path, monkeypatch, "time_on_nodes", arguments, timed.to_json())
    monkeypatch.setattr(netns_switch, "facts", lambda: {"refused": None, "way_out": None, "netem": False})
    monkeypatch.setattr(nodes, "Cluster", None)  # building links would call it
    assert recorded.why_replayed() is None
    monkeypatch.setenv(recorded.REPLAY_VARIABLE, "1")
    with pytest.warns(RuntimeWarning, match=r"link='10mbit' is not built here: COMMHOOKS_LAB_REPLAY_LINKS=1 asks"):
        replayed = nodes.time_on_nodes({"hierarchical": "hierarchical"}, link="10mbit")
    pd.testing.assert_frame_equal(replayed.times, timed.times)


def test_a_study_keeps_its_runs_only_where_the_script_asks(tmp_path, monkeypatch):
    monkeypatch.delenv(recorded.VARIABLE, raising=False)
    recorded.keep("demo", {"links": ("a", "b")}, {"x": 0.1})  # a learner's run: nothing written anywhere
    assert not list(tmp_path.iterdir())
    monkeypatch.setenv(recorded.VARIABLE, str(tmp_path / "kept.json"))
    recorded.keep("demo", {"links": ("a", "b")}, {"x": 0.1})
    recorded.keep("demo", {"links": ("c",)}, {"x": 1 / 3})
    runs = json.loads((tmp_path / "kept.json").read_text())["runs"]
    assert [(r["study"], r["arguments"], r["data"]) for r in runs] == [
        ("demo", {"links": ["a", "b"]}, {"x": 0.1}),
        ("demo", {"links": ["c"]}, {"x": 1 / 3}),
    ]
    assert set(runs[0]["recorded_on"]) == {"date", "cpu", "torch"}


def test_each_recording_was_made_by_its_notebooks_code_and_each_section_behind_a_link_has_one():
    """A notebook edited without being executed again on a machine that builds links fails here: its recording
    would be another code's runs (``scripts/execute_notebooks.py`` rewrites both)."""
    notebooks = course_root() / "notebooks"
    kept = {path.stem: json.loads(path.read_text()) for path in recorded.DIRECTORY.glob("*.json")}
    sections = recorded.link_sections()
    assert len(sections) == 4 and sections[0].startswith("notebook 8, 6. On real slow links"), sections
    assert sections[2:] == [
        "notebook 14, 1. Two nodes on a laptop",
        "notebook 14, 5. Overlap: a hook that does not wait",
    ]
    numbers = {int(section.split(",")[0].split()[1]) for section in sections}
    assert {int(stem[:2]) for stem in kept} == numbers
    for stem, recording in kept.items():
        nb = nbformat.read(notebooks / f"{stem}.ipynb", as_version=4)
        assert recording["code_sha256"] == recorded.code_digest(nb), f"{stem}: run scripts/execute_notebooks.py"
        assert recording["runs"], stem


def test_doctor_is_told_the_sections_and_the_way_out_only_where_links_are_refused(monkeypatch, refused):
    report = recorded.links_report()
    assert report is not None
    assert CAUSE in report["seen"] and "notebook 8, 6. On real slow links" in report["seen"]
    assert "notebook 12, Time to accuracy behind a real slow link" in report["seen"]
    assert report["advice"].startswith(WAY_OUT)
    for way in ("kernel.apparmor_restrict_unprivileged_userns=0", "--security-opt seccomp=unconfined",
                "hosted notebook service (Colab, Kaggle, ...): none"):  # fmt: skip
        assert way in report["advice"]
    monkeypatch.setattr(netns_switch, "facts", lambda: {"refused": None, "way_out": "", "netem": True})
    assert recorded.links_report() is None


def test_the_shared_loopback_is_said_once_in_a_script_as_a_warning_with_cause_way_out_and_the_study(
    monkeypatch, refused
):
    monkeypatch.delenv(isolation.VARIABLE, raising=False)
    monkeypatch.setattr(notes, "_said", set())
    with pytest.warns(RuntimeWarning) as said:
        assert isolation.isolates("gloo", "forkserver") is False
        assert isolation.isolates("gloo", "forkserver") is False
    assert len(said) == 1, [str(w.message) for w in said]
    text = str(said[0].message)
    assert CAUSE in text and WAY_OUT in text and "`lab.studies.links`" in text and "loopback" in text


SHARED = """from commhooks_lab.launcher import isolation, netns_switch
netns_switch.facts = lambda: {"refused": "no namespaces (simulated)", "way_out": "none", "netem": False}
print(isolation.isolates("gloo", "forkserver"), isolation.isolates("gloo", "forkserver"))"""


def test_in_a_kernel_the_shared_loopback_is_one_note_that_strict_nbval_leaves_out(tmp_path):
    """The committed output has no note (made where namespaces are allowed): the run's note, said once in a
    markdown output marked as a note, is no difference; a warning on stderr would be one. (The kernel only asks
    the launcher: no rank server is prewarmed for it.)"""
    nb = nbformat.v4.new_notebook()
    nb.cells.append(nbformat.v4.new_code_cell(SHARED, execution_count=1))
    nb.cells[0].outputs = [nbformat.v4.new_output("stream", name="stdout", text="False False\n")]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, tmp_path / "shared.ipynb")
    out = nbval([tmp_path / "shared.ipynb"], "-rfp", prewarm=False)
    assert failed_notebooks(out.stdout) == set() and "1 passed" in out.stdout, out.stdout[-3000:]
