"""The environment a rank must see, and which of it must be there before torch is imported.

Kept stdlib-only: the package imports it when it starts its rank server, before torch is loaded.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading

from .numerics import ONE_THREAD
from .numerics import variables as numerics_variables

__all__ = ["child_environment", "import_time_part", "patched_environ", "PREWARM_VARIABLE"]

#: Set in every rank, rank server and helper child the lab starts: they never start a rank server themselves.
PREWARM_VARIABLE = "COMMHOOKS_LAB_PREWARM"

#: Variables a library reads when torch (or OpenMP, MKL, CUDA, Python itself) loads. A forked rank
#: inherits them from its rank server, so they are the server's identity; every other variable is
#: set in the rank after the fork, from the notebook's ``os.environ`` at that moment.
IMPORT_TIME_PREFIXES = (
    "ATEN_",
    "OMP_",
    "MKL_",
    "KMP_",
    "GOMP_",
    "OPENBLAS_",
    "BLIS_",
    "VECLIB_",
    "NUMEXPR_",
    "DNNL_",
    "ONEDNN_",
    "CUDA_",
    "PYTORCH_",
    "TORCH_",
    "LD_",
    "PYTHON",
)


_env_lock = threading.Lock()


def _loopback_interface() -> str | None:
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        return None
    return next((n for n in names if n.startswith("lo")), None)


def child_environment(overrides: dict[str, str] | None = None) -> dict[str, str]:
    """Variables the ranks must see *before* they import torch.

    One thread per rank: PyTorch's own CPU kernels split a reduction by thread count, so the
    count changes the last bits (``torch.set_num_threads`` does not reach the kernels a hook runs
    on gloo's callback threads; gloo's element-wise sums do not depend on it), and a laptop's
    cores are shared by the ranks anyway. Portable numerics (:mod:`.numerics`) pins the kernels
    each math library picks by CPU.
    """
    env = {**ONE_THREAD, **numerics_variables(), PREWARM_VARIABLE: "0"}
    loopback = _loopback_interface()
    if loopback and "GLOO_SOCKET_IFNAME" not in os.environ:
        env["GLOO_SOCKET_IFNAME"] = loopback  # hostnames that resolve off-machine break gloo
    env.update(overrides or {})
    return env


def import_time_part(env: dict[str, str]) -> tuple[tuple[str, str], ...]:
    """The variables of ``env`` that must already hold when torch loads, sorted: a rank server's key."""
    return tuple(sorted((k, v) for k, v in env.items() if k.startswith(IMPORT_TIME_PREFIXES)))


@contextlib.contextmanager
def patched_environ(env: dict[str, str]):
    """Children started now (spawn, a rank server's exec) copy ``os.environ``: set ours just for that moment."""
    with _env_lock:
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            yield
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
