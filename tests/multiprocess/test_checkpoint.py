"""Checkpoint and resume: the safe format, the hook-state protocol, and resuming bit for bit."""

import json
import math
import pickle
import time

import numpy as np
import pandas as pd
import pytest
import torch

import commhooks_lab as lab
from commhooks_lab import ExperimentConfig, WorkerError
from commhooks_lab.engine import checkpoint
from commhooks_lab.hooks.compressors import CompressorState, TopK

# -- the format -----------------------------------------------------------------------------------


def test_tree_round_trip_keeps_types_keys_and_random_streams(tmp_path):
    rng = np.random.RandomState(7)
    rng.randint(10)
    tree = {
        0: torch.arange(6.0).reshape(2, 3),
        "nested": {"a": [1, 2.5, None, True], "b": (torch.tensor([1], dtype=torch.int8), "text")},
        "rng": rng,
        "inf": math.inf,
    }
    checkpoint.save_tree(tmp_path / "x", tree)
    back = checkpoint.load_tree(tmp_path / "x")
    assert set(back) == {0, "nested", "rng", "inf"}  # the int key stays an int
    assert torch.equal(back[0], tree[0])
    assert back["nested"]["a"] == [1, 2.5, None, True]
    assert isinstance(back["nested"]["b"], tuple) and back["nested"]["b"][0].dtype == torch.int8
    assert back["inf"] == math.inf
    assert back["rng"].randint(1_000_000, size=5).tolist() == rng.randint(1_000_000, size=5).tolist()


def test_unsaveable_values_are_refused_with_their_place(tmp_path):
    with pytest.raises(TypeError, match="object at /hook/0"):
        checkpoint.save_tree(tmp_path / "x", {"hook": [object()]})
    with pytest.raises(TypeError, match="only int and str keys"):
        checkpoint.save_tree(tmp_path / "x", {(1, 2): 0})


class Payload:
    def __reduce__(self):
        return (print, ("this ran while loading",))


def test_loading_never_unpickles_code(tmp_path, capsys):
    checkpoint.save_tree(tmp_path / "x", {"t": torch.zeros(1)})
    with open(tmp_path / "x.pt", "wb") as f:  # someone replaced the tensors file
        pickle.dump({"t": Payload()}, f, protocol=2)
    with pytest.raises(checkpoint.CheckpointError, match=r"x\.pt cannot be read as tensors") as refused:
        checkpoint.load_tree(tmp_path / "x")
    assert isinstance(refused.value.__cause__, pickle.UnpicklingError)  # weights_only refused the pickle
    assert "this ran" not in capsys.readouterr().out


# -- the hook-state protocol ----------------------------------------------------------------------


def test_compressor_residuals_go_back_to_their_parameters_by_position():
    params = [torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(2))]
    state = CompressorState(TopK(0.5), step=4)
    state.keys = {id(params[1]): 0, id(params[0]): 1}  # seen in reverse order, as DDP's first bucket does
    state.memory = {0: torch.ones(2), 1: torch.full((3,), 2.0)}
    saved = checkpoint.hook_state_dict(state, params)
    assert saved["keys"] == {1: 0, 0: 1}

    others = [torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(2))]  # a new process's
    fresh = CompressorState(TopK(0.5))
    checkpoint.load_hook_state(fresh, saved, others)
    assert fresh.step == 4
    assert fresh.keys == {id(others[1]): 0, id(others[0]): 1}
    assert torch.equal(fresh.memory[fresh.keys[id(others[0])]], torch.full((3,), 2.0))


def test_residuals_without_parameters_are_refused():
    state = CompressorState(TopK(0.5), memory={0: torch.ones(1)})
    with pytest.raises(ValueError, match="parameters="):
        CompressorState(TopK(0.5)).load_state_dict(state.state_dict())


def test_a_state_without_the_protocol_is_named():
    class MyState:
        pass

    with pytest.raises(TypeError, match="MyState cannot be saved: give it state_dict"):
        checkpoint.hook_state_dict(MyState())
    assert checkpoint.hook_state_dict(None) is None


# -- config checks, before any process starts ----------------------------------------------------


def _fake_checkpoint(folder, config: ExperimentConfig, step: int = 4, save_id: str = "one-save") -> None:
    """run.json and both ranks' files of one save, as save_checkpoint writes them (no ranks needed)."""
    for rank in range(config.world_size):
        checkpoint.commit(checkpoint.stage_rank(folder, rank, {"step": step}, save_id))
    meta = {"config": config.to_dict(), "step": step, "world_size": config.world_size, "save_id": save_id}
    checkpoint.write_run(folder, meta)


def test_resuming_another_experiment_is_refused(tmp_path):
    config = ExperimentConfig(steps=10, lr=0.1)
    _fake_checkpoint(tmp_path, config)
    config.replace(resume_from=tmp_path).check()  # the same experiment: fine
    with pytest.raises(ValueError, match="lr: checkpoint 0.1, now 0.05"):
        config.replace(resume_from=tmp_path, lr=0.05).check()
    with pytest.raises(ValueError, match="leaves nothing to run"):
        config.replace(resume_from=tmp_path, steps=4).check()


# -- resuming on two real ranks -------------------------------------------------------------------


MEASURED = ["loss", "rel_error", "cumulative_rel_error", "payload_bytes", "accuracy"]

CASES = {
    # cnn with 10 kB buckets: DDP rebuilds its buckets after step 0, so the saved state is laid out
    # for other buckets than a new DDP model's first step (the resumed run must rebuild first).
    "power_sgd": dict(
        hook="power_sgd",
        state_options={"matrix_approximation_rank": 1, "start_powerSGD_iter": 2},
        model="cnn",
        bucket_cap_mb=0.01,
    ),
    "topk_ef": dict(
        hook="topk", state_options={"ratio": 0.05, "error_feedback": True}, model="cnn", bucket_cap_mb=0.01
    ),
}


@pytest.mark.usefixtures("no_leftover_processes")
@pytest.mark.parametrize("case", sorted(CASES))
def test_resume_with_hook_state_is_bit_identical_and_without_it_is_not(case, cluster, tmp_path):
    base = ExperimentConfig(steps=7, eval_every=1, **CASES[case])
    plain = lab.run(base, cluster=cluster)
    whole = lab.run(base.replace(checkpoint_at=3, checkpoint_dir=tmp_path), cluster=cluster)
    resumed = lab.run(base.replace(resume_from=tmp_path), cluster=cluster)
    dropped = lab.run(base.replace(resume_from=tmp_path, resume_hook_state=False), cluster=cluster)

    assert whole.final["param_digests"] == plain.final["param_digests"]  # saving changes nothing
    assert resumed.final["param_digests"] == whole.final["param_digests"]
    pd.testing.assert_frame_equal(resumed.steps[MEASURED], whole.steps[MEASURED])
    assert "with the hook state" in resumed.notes[-1]

    assert dropped.final["param_digests"] != whole.final["param_digests"]
    assert dropped.steps["loss"].iloc[:4].tolist() == whole.steps["loss"].iloc[:4].tolist()  # the same up to step 3
    assert dropped.steps["loss"].iloc[4:].tolist() != whole.steps["loss"].iloc[4:].tolist()
    assert "WITHOUT the hook state" in dropped.notes[-1]


def test_the_resume_plot_draws_every_run_in_each_panel_and_marks_the_restart():
    from commhooks_lab.plots import resumed
    from commhooks_lab.result import Result

    steps = pd.DataFrame({"step": range(4), "loss": [4.0, 3, 2, 1], "cumulative_rel_error": 0.1, "payload_bytes": 8})
    runs = [Result({"name": name}, steps, pd.DataFrame(), [], {}, {}, None) for name in ("whole", "kept", "lost")]
    fig = resumed(runs, at=2)
    for ax in fig.axes:
        lines = [line for line in ax.get_lines() if line.get_label() in ("whole", "kept", "lost")]
        assert len(lines) == 3
        assert any(list(line.get_xdata()) == [1.5, 1.5] for line in ax.get_lines())
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend == ["whole", "kept", "lost", "restart (resumed at step 2)"]


class Fp16FeedbackState:
    """A learner's own stateful hook state, saved through the documented protocol."""

    def __init__(self, process_group=None):
        self.residual, self.steps = {}, 0

    def state_dict(self):
        return {"residual": dict(self.residual), "steps": self.steps}

    def load_state_dict(self, saved):
        self.residual, self.steps = dict(saved["residual"]), saved["steps"]


def fp16_feedback_hook(state, bucket):
    """fp16 on the wire, with what the cast lost added to the next step's bucket."""
    import torch.distributed as dist

    from commhooks_lab.hooks.contract import completed_future

    buffer = bucket.buffer()
    corrected = buffer + state.residual.get(bucket.index(), 0)
    sent = corrected.half()
    state.residual[bucket.index()] = corrected - sent.float()
    dist.all_reduce(sent)
    buffer.copy_(sent.float() / dist.get_world_size())
    state.steps += bucket.is_last()
    return completed_future(buffer)


@pytest.mark.usefixtures("no_leftover_processes")
def test_your_own_state_resumes_through_state_dict(cluster, tmp_path):
    base = ExperimentConfig(hook=fp16_feedback_hook, state_factory=Fp16FeedbackState, steps=6)
    whole = lab.run(base.replace(checkpoint_at=2, checkpoint_dir=tmp_path), cluster=cluster)
    resumed = lab.run(base.replace(resume_from=tmp_path), cluster=cluster)
    dropped = lab.run(base.replace(resume_from=tmp_path, resume_hook_state=False), cluster=cluster)
    assert resumed.final["param_digests"] == whole.final["param_digests"]
    assert dropped.final["param_digests"] != whole.final["param_digests"]
    assert "Fp16FeedbackState: residual (1 tensors" in resumed.notes[-1] and "steps=2" in resumed.notes[-1]


# -- checkpoints that cannot be mixed or redirected ---------------------------------------------------------

SMALL = dict(hook="power_sgd", state_options={"matrix_approximation_rank": 1, "start_powerSGD_iter": 2}, steps=6)


def test_checkpoint_files_are_private_and_never_written_through_a_link(cluster, tmp_path):
    folder = tmp_path / "ckpt"
    folder.mkdir(mode=0o700)
    victim = tmp_path / "my_notes.txt"
    victim.write_text("mine")
    (folder / "rank0.pt.partial").symlink_to(victim)  # another account's trap
    with pytest.raises(WorkerError, match=r"rank0\.pt\.partial exists and is not a file of ours"):
        lab.run(**SMALL, checkpoint_at=3, checkpoint_dir=folder, cluster=cluster)
    assert victim.read_text() == "mine"
    (folder / "rank0.pt.partial").unlink()
    lab.run(**SMALL, checkpoint_at=3, checkpoint_dir=folder, cluster=cluster)
    modes = {p.name: p.stat().st_mode & 0o777 for p in folder.iterdir()}
    assert set(modes) == {"rank0.json", "rank0.pt", "rank1.json", "rank1.pt", "run.json"}
    assert set(modes.values()) == {0o600}, modes


def test_a_folder_other_accounts_can_write_is_refused_before_ranks_start(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(checkpoint.CheckpointError, match=r"writable by other accounts \(mode 777\)"):
        ExperimentConfig(**SMALL, checkpoint_at=3, checkpoint_dir=shared).check()


@pytest.fixture(scope="module")
def two_saves(cluster, tmp_path_factory):
    """Two checkpoints of the same experiment: one at step 3 and one at step 4 (another save id each)."""
    root = tmp_path_factory.mktemp("saves")
    for name, at in (("a", 3), ("b", 4)):
        lab.run(**SMALL, checkpoint_at=at, checkpoint_dir=root / name, cluster=cluster)
    return root / "a", root / "b"


def _copy(folder, tmp_path, name="mixed"):
    import shutil

    target = tmp_path / name
    shutil.copytree(folder, target)
    return target


@pytest.mark.parametrize("files", [["rank1.json", "rank1.pt"], ["rank1.pt"]])
def test_a_folder_mixing_two_saves_is_refused_naming_the_files(two_saves, tmp_path, files):
    import shutil

    a, b = two_saves
    mixed = _copy(a, tmp_path)
    for name in files:
        shutil.copy(b / name, mixed / name)
    start = time.monotonic()
    with pytest.raises(checkpoint.CheckpointError) as refused:
        lab.run(**SMALL, resume_from=mixed)
    assert time.monotonic() - start < 5, "refused in the notebook, not after ranks hung"
    assert "mixes files from different saves" in str(refused.value)
    assert ", ".join(files) in str(refused.value) and "rank0" not in str(refused.value)


@pytest.mark.parametrize(
    "damage, text",
    [
        ("run.json", r"run\.json is damaged"),
        ("rank0.pt", r"rank0\.pt cannot be read as tensors"),
        ("rank1.json", r"rank1\.json is damaged"),
    ],
)
def test_a_damaged_file_is_named_with_what_to_do(two_saves, tmp_path, damage, text):
    damaged = _copy(two_saves[0], tmp_path)
    data = (damaged / damage).read_bytes()
    (damaged / damage).write_bytes(data[: len(data) // 2])  # truncated, as by a full disk
    with pytest.raises(checkpoint.CheckpointError, match=text) as refused:
        lab.run(**SMALL, resume_from=damaged)
    assert "save the checkpoint again" in str(refused.value)


def test_a_missing_rank_file_is_named(two_saves, tmp_path):
    incomplete = _copy(two_saves[0], tmp_path)
    (incomplete / "rank1.pt").unlink()
    missing = r"incomplete: rank1\.pt missing \(written with world_size=2\)"
    with pytest.raises(checkpoint.CheckpointError, match=missing):
        lab.run(**SMALL, resume_from=incomplete)


def test_an_intact_checkpoint_still_resumes(two_saves, cluster):
    resumed = lab.run(**SMALL, resume_from=two_saves[0], cluster=cluster)
    assert any("resumed from" in note for note in resumed.notes)


def test_a_save_that_fails_on_one_rank_keeps_the_last_save_whole(cluster, tmp_path):
    """Each rank stages its files and none puts them in place unless every rank wrote its own: a second save that
    failed on rank 1 used to replace rank 0's files, leaving a folder of two saves and no good checkpoint."""
    folder = tmp_path / "ckpt"
    lab.run(**SMALL, checkpoint_at=3, checkpoint_dir=folder, cluster=cluster)
    first = checkpoint.check_files(folder)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    (folder / "rank1.pt.partial").symlink_to(tmp_path / "elsewhere")  # rank 1 cannot write its new files
    with pytest.raises(WorkerError, match=r"rank 1 raised CheckpointError: .*rank1\.pt\.partial exists") as info:
        lab.run(**SMALL, checkpoint_at=4, checkpoint_dir=folder, cluster=cluster)
    assert "rank 1 could not write its checkpoint files; the last save is kept" in str(info.value)
    (folder / "rank1.pt.partial").unlink()
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before  # rank 0 staged, then dropped its files
    assert checkpoint.check_files(folder)["save_id"] == first["save_id"]
    resumed = lab.run(**SMALL, resume_from=folder, cluster=cluster)
    assert resumed.final["param_digests"] == lab.run(**SMALL, cluster=cluster).final["param_digests"]


def test_a_full_disk_is_named_and_leaves_no_partial_file(tmp_path, monkeypatch):
    import errno

    def full(*args, **kwargs):
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 64 vs 0")

    monkeypatch.setattr(torch, "save", full)
    with pytest.raises(checkpoint.CheckpointError, match=r"could not write .*x\.pt \(the disk is full\)"):
        checkpoint.save_tree(tmp_path / "x", {"t": torch.zeros(1)})
    monkeypatch.undo()

    def no_space(f):
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(checkpoint.CheckpointError, match=r"x\.json \(the disk is full\)"):
        checkpoint._write_whole(tmp_path / "x.json", no_space)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "edit, says",
    [
        (("run.json", "world_size", "abc"), r"run\.json: world_size must be a whole number >= 1, found 'abc'"),
        (("run.json", "step", "x"), r"run\.json: step must be a whole number >= 0, found 'x'"),
        (("run.json", "step", -2), r"run\.json: step must be a whole number >= 0, found -2"),
        (("run.json", "config", []), r"run\.json: config must be the run's settings, found list"),
        (("rank1.json", "step", 5), r"rank1\.json says step 5, run\.json step 4: the ranks would resume at different"),
    ],
)
def test_a_hand_edited_checkpoint_is_refused_before_ranks_start(tmp_path, edit, says):
    """rank1.json's step 4 -> 5 used to hang 30 s and be blamed on a collective; step -2 in run.json was accepted."""
    config = ExperimentConfig(steps=10)
    _fake_checkpoint(tmp_path, config)
    name, field, value = edit
    document = json.loads((tmp_path / name).read_text())
    if name == "run.json":
        document[field] = value
    else:
        document["tree"]["dict"] = [[k, {"value": value} if k == field else v] for k, v in document["tree"]["dict"]]
    (tmp_path / name).write_text(json.dumps(document))
    with pytest.raises(checkpoint.CheckpointError, match=says):
        config.replace(resume_from=tmp_path).check()


def test_a_checkpoint_dir_that_is_a_file_is_named(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    for folder in (tmp_path / "notes.txt", tmp_path / "notes.txt" / "ckpt"):
        with pytest.raises(checkpoint.CheckpointError, match="is a file, or inside one: give a folder"):
            ExperimentConfig(steps=10, checkpoint_at=3, checkpoint_dir=folder).check()
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_an_optimizer_state_of_another_shape_is_named_not_a_broadcast_error(cluster, tmp_path):
    folder = tmp_path / "ckpt"
    lab.run(**SMALL, optimizer="adam", checkpoint_at=3, checkpoint_dir=folder, cluster=cluster)
    tensors = torch.load(folder / "rank1.pt", weights_only=True)
    key = next(k for k, t in tensors.items() if k.startswith("/optimizer/state/") and t.dim() > 0)
    tensors[key] = torch.zeros(tensors[key].numel() + 1)  # one number more, as a hand edit would leave it
    torch.save(tensors, folder / "rank1.pt")
    with pytest.raises(WorkerError, match=r"rank 1 raised CheckpointError: .*rank1\.pt: the optimizer's '\w+' for"):
        lab.run(**SMALL, optimizer="adam", resume_from=folder, cluster=cluster)


WRONG_STATE = {
    # hook -> the saved tensor to lengthen by one number, as a hand edit would leave it
    "power_sgd": ("/hook_state/error_dict/", r"PowerSGD's error_dict\[\d+\] has \d+ numbers, this model's bucket"),
    "batched_power_sgd": ("/hook_state/p_memory_dict/", r"PowerSGD's p_memory_dict\[\d+\] has \d+ numbers"),
    "topk": ("/hook_state/memory/", r"the residual for parameter \d+ has shape \(\d+,?\), the parameter"),
}


@pytest.mark.parametrize("hook", sorted(WRONG_STATE))
def test_a_hook_state_of_another_shape_is_named_not_a_broadcast_error(hook, cluster, tmp_path):
    """PowerSGD's per-bucket memory and a compressor's residuals: the saved layout resumes, a changed one is named."""
    options = {"ratio": 0.05, "error_feedback": True} if hook == "topk" else {"start_powerSGD_iter": 2}
    run = dict(hook=hook, state_options=options, model="cnn", bucket_cap_mb=0.01, steps=6)
    folder = tmp_path / "ckpt"
    whole = lab.run(**run, checkpoint_at=3, checkpoint_dir=folder, cluster=cluster)
    assert lab.run(**run, resume_from=folder, cluster=cluster).final["param_digests"] == whole.final["param_digests"]
    prefix, says = WRONG_STATE[hook]
    tensors = torch.load(folder / "rank1.pt", weights_only=True)
    key = max((k for k in tensors if k.startswith(prefix)), key=lambda k: tensors[k].numel())
    tensors[key] = torch.zeros(tensors[key].numel() + 1)
    torch.save(tensors, folder / "rank1.pt")
    with pytest.raises(WorkerError, match=rf"rank 1 raised CheckpointError: .*rank1\.pt: {says}"):
        lab.run(**run, resume_from=folder, cluster=cluster)
