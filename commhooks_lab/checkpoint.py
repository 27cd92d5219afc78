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

import inspect
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch
import torch.distributed as dist

from .quiet import quiet_logger

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


def _write_whole(path: Path, write: Callable[[BinaryIO], Any]) -> None:
    """Write to a temporary name, then rename: a crash never leaves half a file under ``path``."""
    partial = path.with_name(path.name + ".partial")
    with open(partial, "wb") as f:
        write(f)
    os.replace(partial, path)


def save_tree(stem: Path, tree: Any) -> None:
    """``stem``.json and ``stem``.pt; written to temporary names first, so a crash leaves no half file."""
    tensors: dict[str, torch.Tensor] = {}
    structure = _encode(tree, tensors, "")
    _write_whole(stem.with_suffix(".pt"), lambda f: torch.save(tensors, f))
    _write_whole(stem.with_suffix(".json"), lambda f: f.write(json.dumps(structure).encode()))


def load_tree(stem: Path, device: torch.device | str = "cpu") -> Any:
    """Read what :func:`save_tree` wrote; tensors with ``weights_only=True`` (no code is unpickled)."""
    structure = json.loads(stem.with_suffix(".json").read_text())
    tensors = torch.load(stem.with_suffix(".pt"), map_location="cpu", weights_only=True)
    return _decode(structure, tensors, device)


# -- hook state -------------------------------------------------------------------------------


def _is_power_sgd_state(state: Any) -> bool:
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState

    return isinstance(state, PowerSGDState)


#: PowerSGDState's own (de)serialisers log a NOTE about the process group every time.
POWER_SGD_LOGGER = "torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook"


def is_stateless(state: Any) -> bool:
    return state is None or isinstance(state, dist.ProcessGroup)


def _with_parameters(method, parameters: list | None) -> dict:
    takes = "parameters" in inspect.signature(method).parameters
    return {"parameters": parameters} if takes and parameters is not None else {}


def hook_state_dict(state: Any, parameters: list | None = None) -> Any:
    """What a hook remembers between steps, as a tree :func:`save_tree` can write."""
    if is_stateless(state):
        return None
    if _is_power_sgd_state(state):
        with quiet_logger(POWER_SGD_LOGGER):
            return state.__getstate__()
    if callable(getattr(state, "state_dict", None)):
        return state.state_dict(**_with_parameters(state.state_dict, parameters))
    raise TypeError(
        f"the hook state {type(state).__name__} cannot be saved: give it state_dict() -> dict and "
        "load_state_dict(d) (tensors, numbers, strings, lists and dicts), as commhooks_lab.checkpoint describes"
    )


def load_hook_state(state: Any, saved: Any, parameters: list | None = None) -> None:
    """Put ``saved`` back into the state object the hook was registered with (DDP holds that object)."""
    if is_stateless(state):
        return
    if _is_power_sgd_state(state):
        with quiet_logger(POWER_SGD_LOGGER):
            state.__setstate__(saved)
        return
    state.load_state_dict(saved, **_with_parameters(state.load_state_dict, parameters))


# -- a run's checkpoint -----------------------------------------------------------------------


def rank_stem(folder: str | Path, rank: int) -> Path:
    return Path(folder) / f"rank{rank}"


def save_rank(folder: str | Path, rank: int, tree: dict) -> None:
    Path(folder).mkdir(parents=True, exist_ok=True)
    save_tree(rank_stem(folder, rank), tree)


def load_rank(folder: str | Path, rank: int, device: torch.device | str) -> dict:
    stem = rank_stem(folder, rank)
    if not stem.with_suffix(".json").exists():
        raise FileNotFoundError(f"{stem}.json is missing: was the checkpoint written with this many ranks?")
    return load_tree(stem, device)


def write_run(folder: str | Path, meta: dict) -> None:
    _write_whole(Path(folder) / RUN_FILE, lambda f: f.write(json.dumps(meta, default=str).encode()))


def read_run(folder: str | Path) -> dict:
    path = Path(folder) / RUN_FILE
    if not path.exists():
        raise ValueError(f"no checkpoint in {folder}: {RUN_FILE} is missing (run with checkpoint_at=k first)")
    return json.loads(path.read_text())


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
    return meta
