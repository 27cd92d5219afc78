"""Save a run at step k and resume it from the files alone (new processes too), hook state included, safely.

A comm hook's memory (PowerSGD's error feedback and warm-start matrices, a compressor's residuals)
is not in ``model.state_dict()``, and DDP takes a hook only once per model, so a resumed job
quietly starts that memory from zero (pytorch/pytorch#75666). Here every rank writes its own
pair of files: ``rank{r}.json`` (structure and plain values) and ``rank{r}.pt`` (tensors only,
read back with ``torch.load(weights_only=True)``): loading a checkpoint never unpickles code.

The hook-state protocol: PyTorch's ``PowerSGDState`` is saved through its own
``__getstate__``/``__setstate__`` (it drops and restores the process group); any other state
object saves with ``state_dict()`` and restores with ``load_state_dict(d)``, where ``d`` holds
tensors, numbers, strings, None, lists, tuples, dicts (int or str keys) and numpy RandomStates.
A state that knows parameters by ``id(param)`` (meaningless in another process) may take a
``parameters=`` keyword in both, the model's parameters in order, and save positions instead.
States with nothing to remember (None, a process group) need neither.
"""

from __future__ import annotations

import errno
import inspect
import json
import os
import re
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch
import torch.distributed as dist

from .._util import quiet_logger
from ..safe_files import Folder, UnsafeFileError, parse_json

__all__ = [
    "check_resume",
    "CheckpointError",
    "hook_state_dict",
    "load_hook_state",
    "load_rank",
    "load_tree",
    "private_folder",
    "rank_file",
    "read_run",
    "commit",
    "discard",
    "save_tree",
    "stage_rank",
    "stage_tree",
    "write_run",
]

#: Written by rank 0: which run this is, where it stopped, and the rows measured so far.
RUN_FILE = "run.json"
#: Config fields a resumed run must share with the checkpoint's run, or it is another experiment.
SAME_EXPERIMENT = (
    "hook",
    "wrapper",
    "state_options",
    "model",
    "world_size",
    "batch_size",
    "optimizer",
    "lr",
    "seed",
    "bucket_cap_mb",
    "measure",
    "api",
)


# -- a tree of plain values and tensors <-> JSON + a tensors-only file --------------------------


def _encode(value: Any, tensors: dict[str, torch.Tensor], path: str) -> Any:
    if isinstance(value, torch.Tensor):
        tensors[path] = value.detach().cpu().clone()
        return {"tensor": path}
    if isinstance(value, np.random.RandomState):
        kind, keys, pos, has_gauss, cached = value.get_state(legacy=True)
        tensors[path] = torch.from_numpy(np.asarray(keys, dtype=np.int64))
        return {"random_state": path, "kind": kind, "pos": int(pos), "has_gauss": int(has_gauss), "cached": cached}
    if isinstance(value, dict):
        items = []
        for key, item in value.items():
            if isinstance(key, bool) or not isinstance(key, (int, str)):
                raise TypeError(f"cannot save the key {key!r} at {path or 'the top'}: only int and str keys are saved")
            items.append([key, _encode(item, tensors, f"{path}/{key}")])
        return {"dict": items}
    if isinstance(value, (list, tuple)):
        kind = "list" if isinstance(value, list) else "tuple"
        return {kind: [_encode(item, tensors, f"{path}/{i}") for i, item in enumerate(value)]}
    if value is None or isinstance(value, (bool, int, float, str)):
        return {"value": value}
    if isinstance(value, (np.integer, np.floating, np.bool_)):
        return {"value": value.item()}
    raise TypeError(
        f"cannot save a {type(value).__name__} at {path or 'the top'}: a hook state's state_dict() may hold "
        "tensors, numbers, strings, None, lists, tuples, dicts and numpy RandomStates"
    )


def _decode(node: dict, tensors: dict[str, torch.Tensor], device: torch.device | str) -> Any:
    if "tensor" in node:
        return tensors[node["tensor"]].to(device)
    if "random_state" in node:
        rng = np.random.RandomState()
        keys = tensors[node["random_state"]].numpy().astype(np.uint32)
        rng.set_state((node["kind"], keys, node["pos"], node["has_gauss"], node["cached"]))
        return rng
    if "dict" in node:
        return {key: _decode(item, tensors, device) for key, item in node["dict"]}
    if "list" in node:
        return [_decode(item, tensors, device) for item in node["list"]]
    if "tuple" in node:
        return tuple(_decode(item, tensors, device) for item in node["tuple"])
    return node["value"]


#: Files are created only where they did not exist (no link is followed) and readable by their owner alone.
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
_READ = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
#: The key of the save id in a rank's tensors file (its JSON holds the same id).
SAVE_ID_KEY = "__save_id__"


class CheckpointError(ValueError):
    """A checkpoint folder that cannot be trusted or read: which file, what is wrong, what to do."""


def private_folder(folder: str | Path) -> Path:
    """``folder``, created with mode 0700 if missing; refused if another account could replace what is in it.

    A folder another account owns or may write into lets that account swap a file between our write and our
    read, or plant a link where we write: so it must be ours, not group- or world-writable, and not a link.
    """
    folder = Path(folder)
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise CheckpointError(f"checkpoint folder {folder} is a file, or inside one: give a folder") from None
    info = os.lstat(folder)
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise CheckpointError(f"checkpoint folder {folder} is a link or not a folder: use a folder of your own")
    if hasattr(os, "getuid") and info.st_uid != os.getuid():
        raise CheckpointError(
            f"checkpoint folder {folder} belongs to another account (uid {info.st_uid}): it could replace the files; "
            "use a folder of your own"
        )
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise CheckpointError(
            f"checkpoint folder {folder} is writable by other accounts (mode {stat.S_IMODE(info.st_mode):o}): they "
            f"could replace the files. Make it yours alone (chmod 700 {folder}) or use another folder"
        )
    return folder


def _write_partial(path: Path, write: Callable[[BinaryIO], Any]) -> Path:
    """Write ``path``'s content under a temporary name beside it, and return that name; ``path`` is untouched.

    The temporary file is created new (a leftover of ours is removed first; a link or another account's file
    there is refused), mode 0600, without following links. A failed write (a full disk) removes it and says so.
    """
    partial = path.with_name(path.name + ".partial")
    try:
        fd = os.open(partial, _CREATE, 0o600)
    except FileExistsError as exc:
        info = os.lstat(partial)
        if not stat.S_ISREG(info.st_mode) or (hasattr(os, "getuid") and info.st_uid != os.getuid()):
            raise CheckpointError(f"{partial} exists and is not a file of ours (a link?): not writing there") from exc
        os.unlink(partial)  # our own leftover from a crash
        fd = os.open(partial, _CREATE, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
    except Exception as exc:  # torch.save on a full disk: "enforce fail at inline_container.cc ... unexpected pos"
        partial.unlink(missing_ok=True)
        full = isinstance(exc, OSError) and exc.errno == errno.ENOSPC or "unexpected pos" in str(exc)
        cause = "the disk is full" if full else f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        raise CheckpointError(f"could not write {path} ({cause}); the checkpoint there before is kept") from exc
    return partial


def _write_whole(path: Path, write: Callable[[BinaryIO], Any]) -> None:
    """Write to a temporary name, then rename: a crash never leaves half a file under ``path`` (the rename
    replaces a link at ``path`` itself)."""
    os.replace(_write_partial(path, write), path)


#: The most the lab reads of a checkpoint file: a rank's tensors (the widest model's weights and optimizer state
#: are tens of MB), or the JSON beside them (run.json holds every row measured so far).
MAX_TENSORS_BYTES = 4 << 30
MAX_JSON_BYTES = 64 << 20
#: What a refusal of a checkpoint's file tells the learner to do.
_ADVICE = "a checkpoint folder holds only the files the lab wrote; save the checkpoint again, or resume from another"


def _read_bytes(path: Path, limit: int) -> bytes:
    """A checkpoint file's bytes: a regular file in its folder, not through a link, never a FIFO or a device."""
    try:
        with Folder.open(path.parent, _ADVICE) as folder:
            return folder.read(path.name, limit)
    except UnsafeFileError as exc:
        raise CheckpointError(str(exc)) from None


def stage_tree(stem: Path, tree: Any, save_id: str = "") -> list[Path]:
    """Write ``stem``.pt and ``stem``.json under temporary names (:func:`commit` puts them in place); a save
    already there stays whole until then."""
    tensors: dict[str, torch.Tensor] = {}
    structure = _encode(tree, tensors, "")
    tensors[SAVE_ID_KEY] = torch.tensor(list(save_id.encode()), dtype=torch.uint8)
    staged = [_write_partial(stem.with_suffix(".pt"), lambda f: torch.save(tensors, f))]
    document = {"save_id": save_id, "tree": structure}
    try:
        staged.append(_write_partial(stem.with_suffix(".json"), lambda f: f.write(json.dumps(document).encode())))
    except BaseException:
        discard(staged)
        raise
    return staged


def commit(staged: list[Path]) -> None:
    """Rename staged files to their own names (``x.pt.partial`` -> ``x.pt``), each rename atomic."""
    for partial in staged:
        os.replace(partial, partial.with_suffix(""))


def discard(staged: list[Path]) -> None:
    for partial in staged:
        partial.unlink(missing_ok=True)


def save_tree(stem: Path, tree: Any, save_id: str = "") -> None:
    """``stem``.json and ``stem``.pt; written to temporary names first, so a crash leaves no half file."""
    commit(stage_tree(stem, tree, save_id))


def _read_json(path: Path) -> Any:
    try:
        return parse_json(_read_bytes(path, MAX_JSON_BYTES), path, _ADVICE)
    except UnsafeFileError as exc:  # damaged, too deep, an integer of thousands of digits: named, not bare
        raise CheckpointError(str(exc)) from None


def _refusal_reason(exc: Exception) -> str:
    """Why torch.load refused a file, in its own words, without its advice to load with ``weights_only=False``
    (which runs whatever code the file holds): the unpickler's verdict line where it gives one."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    verdict = next((line.split(". ")[0] for line in lines if line.startswith("WeightsUnpickler error")), None)
    return f"{type(exc).__name__}: {verdict or (lines[0] if lines else '')}"[:300]


def _read_tensors(path: Path) -> dict:
    import io

    data = _read_bytes(path, MAX_TENSORS_BYTES)
    try:
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:  # a truncated file, or one holding more than tensors (weights_only refuses it)
        raise CheckpointError(
            f"{path} cannot be read as tensors ({_refusal_reason(exc)}): damaged, or not written by the lab. The lab "
            "reads checkpoints with weights_only=True and never otherwise: loading this file with weights_only=False "
            "would run any code it holds; save the checkpoint again, or resume from another"
        ) from exc


def _save_id_of_tensors(tensors: dict) -> str:
    return bytes(tensors.get(SAVE_ID_KEY, torch.zeros(0, dtype=torch.uint8)).tolist()).decode()


def load_tree(stem: Path, device: torch.device | str = "cpu") -> Any:
    """Read what :func:`save_tree` wrote; tensors with ``weights_only=True`` (no code is unpickled)."""
    document = _read_json(stem.with_suffix(".json"))
    tensors = _read_tensors(stem.with_suffix(".pt"))
    if _save_id_of_tensors(tensors) != document.get("save_id", ""):
        raise CheckpointError(f"{stem}.json and {stem}.pt come from different saves: save the checkpoint again")
    return _decode(document["tree"], tensors, device)


# -- hook state -------------------------------------------------------------------------------


def _is_power_sgd_state(state: Any) -> bool:
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState

    return isinstance(state, PowerSGDState)


#: PowerSGDState's own (de)serialisers log a NOTE about the process group every time.
POWER_SGD_LOGGER = "torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook"


def _is_stateless(state: Any) -> bool:
    return state is None or isinstance(state, dist.ProcessGroup)


def _with_parameters(method, parameters: list | None) -> dict:
    takes = "parameters" in inspect.signature(method).parameters
    return {"parameters": parameters} if takes and parameters is not None else {}


def hook_state_dict(state: Any, parameters: list | None = None) -> Any:
    """What a hook remembers between steps, as a tree :func:`save_tree` can write."""
    if _is_stateless(state):
        return None
    if _is_power_sgd_state(state):
        with quiet_logger(POWER_SGD_LOGGER):
            return state.__getstate__()
    if callable(getattr(state, "state_dict", None)):
        return state.state_dict(**_with_parameters(state.state_dict, parameters))
    raise TypeError(
        f"the hook state {type(state).__name__} cannot be saved: give it state_dict() -> dict and "
        "load_state_dict(d) (tensors, numbers, strings, lists and dicts), as commhooks_lab.engine.checkpoint describes"
    )


def load_hook_state(state: Any, saved: Any, parameters: list | None = None) -> None:
    """Put ``saved`` back into the state object the hook was registered with (DDP holds that object)."""
    if _is_stateless(state):
        return
    if _is_power_sgd_state(state):
        with quiet_logger(POWER_SGD_LOGGER):
            state.__setstate__(saved)
        return
    state.load_state_dict(saved, **_with_parameters(state.load_state_dict, parameters))


# -- a run's checkpoint -----------------------------------------------------------------------


def _rank_stem(folder: str | Path, rank: int) -> Path:
    return Path(folder) / f"rank{rank}"


def rank_file(folder: str | Path, rank: int) -> Path:
    """The file that holds a rank's tensors (its model, optimizer and hook state)."""
    return _rank_stem(folder, rank).with_suffix(".pt")


def stage_rank(folder: str | Path, rank: int, tree: dict, save_id: str) -> list[Path]:
    """This rank's files of a new save, under temporary names: the folder's last save stays whole."""
    return stage_tree(_rank_stem(private_folder(folder), rank), tree, save_id)


def load_rank(folder: str | Path, rank: int, device: torch.device | str) -> dict:
    stem = _rank_stem(folder, rank)
    if not stem.with_suffix(".json").exists():
        raise FileNotFoundError(f"{stem}.json is missing: was the checkpoint written with this many ranks?")
    return load_tree(stem, device)


def write_run(folder: str | Path, meta: dict) -> None:
    _write_whole(private_folder(folder) / RUN_FILE, lambda f: f.write(json.dumps(meta, default=str).encode()))


def read_run(folder: str | Path) -> dict:
    path = Path(folder) / RUN_FILE
    if not path.exists():
        raise CheckpointError(f"no checkpoint in {folder}: {RUN_FILE} is missing (run with checkpoint_at=k first)")
    meta = _read_json(path)
    if not isinstance(meta, dict) or not {"config", "step", "world_size"} <= set(meta):
        raise CheckpointError(f"{path} is not a lab checkpoint's {RUN_FILE}: save the checkpoint again")
    for name, least in (("world_size", 1), ("step", 0)):
        value = meta[name]
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise CheckpointError(
                f"{path}: {name} must be a whole number >= {least}, found {value!r} (edited by hand?)"
            )
    if not isinstance(meta["config"], dict):
        raise CheckpointError(f"{path}: config must be the run's settings, found {type(meta['config']).__name__}")
    return meta


def _saved_step(document: Any) -> Any:
    """The ``step`` a rank's JSON file records (None if it has none where save_checkpoint puts it)."""
    items = document.get("tree", {}).get("dict", []) if isinstance(document, dict) else []
    return next((item[1].get("value") for item in items if isinstance(item, list) and item[:1] == ["step"]), None)


def _rank_files_present(folder: Path) -> int:
    """How many ranks' files the folder holds, counted from one listing (no name is probed)."""
    try:
        with Folder.open(folder, _ADVICE) as opened:
            names = opened.names()
    except UnsafeFileError as exc:
        raise CheckpointError(str(exc)) from None
    return len({name[4:].split(".")[0] for name in names if re.fullmatch(r"rank[0-9]+\.(json|pt)", name)})


def check_files(folder: str | Path, meta: dict | None = None) -> dict:
    """run.json and every rank's two files: present, readable, and all from the same save; else which is not.

    Run in the notebook before any rank starts, so a mixed, damaged or incomplete folder is refused with the
    files it names instead of ranks that resume with different weights, or hang waiting for each other.
    """
    folder = Path(folder)
    meta = read_run(folder) if meta is None else meta
    save_id = meta.get("save_id")
    if not save_id:
        raise CheckpointError(f"{folder / RUN_FILE} has no save id: it was written before checkpoints had one")
    present = _rank_files_present(folder)
    if present < meta["world_size"]:  # before probing rank0..N: a forged world_size of 10**9 is one comparison
        raise CheckpointError(
            f"checkpoint {folder} is incomplete: {RUN_FILE} says world_size={meta['world_size']}, the folder holds "
            f"files for {present} ranks; save it again"
        )
    mixed, missing = [], []
    for rank in range(int(meta["world_size"])):
        stem = _rank_stem(folder, rank)
        for path, read in ((stem.with_suffix(".json"), _read_json), (stem.with_suffix(".pt"), _read_tensors)):
            try:
                content = read(path)
            except FileNotFoundError:
                missing.append(path.name)
                continue
            found = content.get("save_id") if path.suffix == ".json" else _save_id_of_tensors(content)
            if found != save_id:
                mixed.append(path.name)
            elif path.suffix == ".json" and _saved_step(content) != meta["step"]:
                raise CheckpointError(
                    f"{path} says step {_saved_step(content)!r}, {RUN_FILE} step {meta['step']}: the ranks would "
                    "resume at different steps and wait for each other. Save the checkpoint again"
                )
    if missing:
        raise CheckpointError(
            f"checkpoint {folder} is incomplete: {', '.join(missing)} missing (written with "
            f"world_size={meta['world_size']}); save it again"
        )
    if mixed:
        raise CheckpointError(
            f"checkpoint {folder} mixes files from different saves: {', '.join(mixed)} do not belong to the save "
            f"{RUN_FILE} describes (step {meta['step']}); resuming would give ranks different weights. Save the "
            "checkpoint again into an empty folder"
        )
    return meta


def check_resume(config_dict: dict, folder: str | Path) -> dict:
    """The checkpoint's metadata, if ``config_dict`` continues the same experiment; else a clear error."""
    meta = read_run(folder)
    saved = meta["config"]
    now = json.loads(json.dumps(config_dict, default=str))  # compared as the checkpoint stored them
    differ = [
        f"{k}: checkpoint {saved.get(k)!r}, now {now.get(k)!r}" for k in SAME_EXPERIMENT if saved.get(k) != now.get(k)
    ]
    if differ:
        raise ValueError(f"resume_from={str(folder)!r} is another experiment; these differ: " + "; ".join(differ))
    if meta["step"] >= config_dict["steps"]:
        raise ValueError(
            f"the checkpoint is at step {meta['step']}; steps={config_dict['steps']} leaves nothing to run"
        )
    return check_files(folder, meta)  # the rank files last: the config above is compared without opening them
