"""Refuse bad launch options before any process starts, with a message that says what to do.

Two kinds of check: those that hold everywhere (types, names) and the laptop limits, which
only make sense when the lab itself starts the ranks on this machine. Under torchrun or
``accelerate launch`` the launcher decides the world size and the devices, not this machine.
"""

from __future__ import annotations

import math
import multiprocessing
import numbers
import os
import sys

__all__ = [
    "check_common_options",
    "check_environment",
    "check_launch_options",
    "check_link",
    "check_timeout",
    "DEFAULT_START_METHOD",
    "DEFAULT_TIMEOUT_S",
    "max_local_world_size",
]

BACKENDS = ("gloo", "nccl")
#: How the lab starts ranks unless told: its rank server on Linux, where it is measured and tested
#: (:mod:`.rank_server`). Elsewhere spawn stays the default (on macOS, forking after torch and Apple's Accelerate
#: framework have loaded is not known to be safe); ``start_method="forkserver"`` asks for the server anywhere.
DEFAULT_START_METHOD = "forkserver" if sys.platform.startswith("linux") else "spawn"
#: Lessons wait this long for a silent rank: long enough for a step, short enough to stay in the lesson.
DEFAULT_TIMEOUT_S = 30.0
#: A wait longer than a week is a mistake, not a lesson (and ``timedelta`` overflows long before infinity).
MAX_TIMEOUT_S = 7 * 24 * 3600.0
#: Ranks must meet within timeout_s; gloo rounds 1e-9 s down to 0 ms and times out at once.
MIN_TIMEOUT_S = 1.0


def max_local_world_size() -> int:
    """More ranks than this on one machine only measures the scheduler, not the hook."""
    return max(8, 2 * (os.cpu_count() or 1))


def _cuda_device_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def check_common_options(world_size, backend, timeout_s) -> None:
    """What must hold wherever the ranks come from: a positive world size, a known backend, a timeout."""
    if isinstance(world_size, bool) or not isinstance(world_size, numbers.Integral):
        raise TypeError(f"world_size must be a positive int (number of ranks), got {world_size!r}")
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    check_timeout(timeout_s)
    if backend is not None and backend not in BACKENDS:
        raise ValueError(
            f"unknown backend {backend!r}; choose 'gloo' (CPU) or 'nccl' (one GPU per rank), or None to pick"
        )


def check_timeout(timeout_s):
    """``timeout_s`` as given, if it is a number of seconds the ranks can meet in and a ``timedelta`` can hold."""
    if (
        isinstance(timeout_s, bool)
        or not isinstance(timeout_s, numbers.Real)
        or not math.isfinite(float(timeout_s))
        or not 0 < float(timeout_s) <= MAX_TIMEOUT_S
    ):
        raise ValueError(
            f"timeout_s must be a finite number of seconds, more than 0 and at most {MAX_TIMEOUT_S:g} (a week), "
            f"got {timeout_s!r}"
        )
    if timeout_s < MIN_TIMEOUT_S:
        raise ValueError(
            f"timeout_s={timeout_s!r} is shorter than the ranks can meet in: give at least "
            f"{MIN_TIMEOUT_S:g} s (the default is {DEFAULT_TIMEOUT_S:g})"
        )
    return timeout_s


def check_environment(env) -> dict[str, str]:
    """``Cluster(env=...)``: names and values must be strings (os.environ holds nothing else)."""
    if env is None:
        return {}
    if not isinstance(env, dict):
        raise TypeError(f"env must be a dict of str to str, got {type(env).__name__}")
    wrong = [f"{k!r}: {v!r}" for k, v in env.items() if not isinstance(k, str) or not isinstance(v, str)]
    if wrong:
        raise TypeError(f"env must map str to str (os.environ holds strings only): {', '.join(wrong[:5])}")
    return dict(env)


def check_launch_options(world_size, backend, timeout_s, start_method) -> str:
    """Checks for ranks the lab starts on this machine; returns the backend to use.

    ``None`` picks nccl if every rank gets a GPU of its own here, else gloo.
    """
    check_common_options(world_size, backend, timeout_s)
    world_size = int(world_size)
    limit = max_local_world_size()
    if world_size > limit:
        raise ValueError(
            f"world_size={world_size} would start {world_size} processes on a machine with "
            f"{os.cpu_count()} CPU cores; the lab allows at most {limit} here. "
            "For more ranks use torchrun or accelerate launch on a real cluster."
        )
    methods = multiprocessing.get_all_start_methods()
    if start_method not in methods:
        raise ValueError(
            f"unknown start_method {start_method!r}; choose one of {methods} ('forkserver', the lab's "
            "preloaded rank server, and 'spawn' are safe in notebooks; 'fork' is not)"
        )
    if backend is None:
        return "nccl" if _cuda_device_count() >= world_size else "gloo"
    if backend == "nccl" and _cuda_device_count() < world_size:
        raise ValueError(
            f"backend='nccl' needs one CUDA device per rank: world_size={world_size}, "
            f"CUDA devices here: {_cuda_device_count()}. Use backend='gloo' to run on CPU."
        )
    return backend


def check_link(link, start_method: str, backend: str):
    """The :class:`~.link.Link` the ranks sit behind (None: the machine's loopback), refused here, before any
    process starts, if the spec is wrong or this machine cannot give ranks a private network."""
    from .link_spec import as_link
    from .netns_switch import WITHOUT_A_LINK, NetworkUnavailableError, why_unavailable

    parsed = as_link(link)
    if parsed is None:
        return None
    if start_method != "forkserver":
        raise ValueError(
            f"link={parsed.spec!r} needs start_method='forkserver': the ranks are forked inside the lab's private "
            f"network by its rank server, and start_method={start_method!r} starts them outside it"
        )
    if backend != "gloo":
        raise ValueError(f"link={parsed.spec!r} shapes gloo's sockets; backend={backend!r} talks over other paths")
    why = why_unavailable()
    if why is not None:
        raise NetworkUnavailableError(f"link={parsed.spec!r} cannot be built on this machine: {why}; {WITHOUT_A_LINK}")
    return parsed
