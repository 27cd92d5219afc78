"""``python -m commhooks_lab doctor``: find the laptop that will fail before the workshop starts.

Each check returns what it saw, pass or fail, and what to do about a failure. The table is
plain text so an instructor can collect it from a room of laptops; the exit code is non-zero
when any check fails.
"""

from __future__ import annotations

import multiprocessing
import os
import platform
import sys
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from .course import install_paths

__all__ = [
    "all_checks",
    "Check",
    "check_bf16_hook",
    "check_nbval",
    "check_numerics",
    "check_private_network",
    "check_python",
    "check_rendezvous",
    "check_start_method",
    "check_widgets",
    "main",
]

PASS, FAIL, INFO = "pass", "FAIL", "info"
MIN_PYTHON = (3, 10)
MIN_MEMORY_GIB = 4.0


@dataclass
class Check:
    name: str
    status: str  # PASS | FAIL | INFO
    seen: str
    advice: str = ""


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def check_python() -> Check:
    seen = platform.python_version()
    ok = sys.version_info[:2] >= MIN_PYTHON
    return Check(
        "python",
        PASS if ok else FAIL,
        seen,
        "" if ok else f"install Python >= {MIN_PYTHON[0]}.{MIN_PYTHON[1]} and recreate the venv",
    )


def check_torch() -> Check:
    try:
        import torch
        import torch.distributed as dist
    except ImportError as exc:
        return Check(
            "torch",
            FAIL,
            f"not importable ({exc})",
            f"from the repository root: {install_paths.SETUP_COMMAND} (or {install_paths.CPU_SETUP_COMMAND} for the "
            "CPU build)",
        )
    build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU build"
    if not dist.is_available() or not dist.is_gloo_available():
        return Check(
            "torch",
            FAIL,
            f"{torch.__version__} ({build}) without gloo",
            "install a torch build with torch.distributed (the official wheels have it)",
        )
    return Check("torch", PASS, f"{torch.__version__} ({build})")


def check_accelerator() -> Check:
    """GPUs are optional: the lab runs on CPU. A CUDA build without a GPU works, at several GB more than needed."""
    import torch

    if not torch.cuda.is_available():
        if torch.version.cuda is None:
            return Check("GPU / NCCL", INFO, "no CUDA device: ranks run on CPU with gloo")
        return Check(
            "GPU / NCCL",
            INFO,
            f"no CUDA device: ranks run on CPU with gloo, on a CUDA {torch.version.cuda} build",
            f"the CPU-only build is enough here and far smaller; {install_paths.cpu_only_advice()}",
        )
    nccl = ".".join(map(str, torch.cuda.nccl.version())) if hasattr(torch.cuda, "nccl") else "?"
    return Check("GPU / NCCL", INFO, f"{torch.cuda.device_count()} CUDA device(s), NCCL {nccl}")


def check_bf16_hook() -> Check:
    """What DDP does with ``bf16_compress_hook`` here, tried in a child: it depends on the build, not the device."""
    from .launcher import torch_build

    seen = torch_build.in_child()
    build, bf16 = torch_build.describe(seen["build"]), seen["bf16"]
    if bf16["accepted"]:
        ran = "one step's gradient came back rounded to bfloat16" if bf16["rounded"] else "but its step went wrong"
        return Check(
            "bf16 hooks",
            INFO if bf16["rounded"] else FAIL,
            f"DDP accepts bf16_compress_hook on {build}: registered in a one-rank gloo group, {ran}",
            "" if bf16["rounded"] else "report this machine's torch build",
        )
    return Check(
        "bf16 hooks",
        INFO,
        f"DDP refuses bf16_compress_hook on {build} ({bf16['refusal']}); the lab measures the same arithmetic "
        "inside its probe (notebook 3 explains)",
    )


def _memory_gib() -> float:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30


def check_machine() -> Check:
    cores, memory = os.cpu_count() or 1, _memory_gib()
    seen = f"{cores} cores, {memory:.1f} GiB"
    if memory < MIN_MEMORY_GIB:
        return Check(
            "cores / memory",
            FAIL,
            seen,
            f"each rank imports torch (~0.5 GiB): close other programs or use a machine with >= {MIN_MEMORY_GIB:g} GiB",
        )
    return Check("cores / memory", PASS, seen, "" if cores >= 2 else "one core: runs work, but slowly")


def check_rendezvous() -> Check:
    """The ranks' rendezvous: a FileStore in a folder only this account can enter (no socket at all)."""
    import stat
    from datetime import timedelta

    import torch.distributed as dist

    from .launcher.store import PrivateRendezvous

    name = "private rendezvous"
    try:
        rendezvous = PrivateRendezvous()
    except OSError as exc:
        return Check(name, FAIL, f"{type(exc).__name__}: {exc}", "the temp folder must be writable: check TMPDIR")
    try:
        store = dist.FileStore(rendezvous.path, 1)
        store.set_timeout(timedelta(seconds=5))
        store.set("doctor", "ok")
        ok = store.get("doctor") == b"ok"
        mode = stat.S_IMODE(os.stat(rendezvous.folder).st_mode)
        del store
    except Exception as exc:
        return Check(name, FAIL, f"{type(exc).__name__}: {exc}", "report this machine's torch build and file system")
    finally:
        rendezvous.close()
    seen = f"FileStore in a {mode:o} folder answers" if ok else "the FileStore does not answer"
    return Check(name, PASS if ok and mode == 0o700 else FAIL, seen)


def check_private_network() -> Check:
    """Can another account reach the ranks' gloo sockets? Not where the ranks get a network namespace of their own."""
    from .launcher import isolation
    from .launcher.rank_server import DEFAULT_START_METHOD

    name = "ranks' network"
    open_to_all = (
        "their gloo sockets are on this machine's loopback, where any local account can connect: one that answers "
        "gloo's handshake first takes a rank's place (the run times out), one that connects a thousand times fills "
        "a rank's file descriptors (it aborts)"
    )
    try:
        why = isolation.why_not_isolated("gloo", DEFAULT_START_METHOD)
    except ValueError as exc:
        return Check(name, FAIL, str(exc))
    if why is None:
        return Check(name, PASS, "gloo ranks in a private network namespace: no other account can reach their sockets")
    advice = "on a machine only you use this does not matter; on a shared server allow unprivileged user namespaces"
    return Check(name, INFO, f"{open_to_all} ({why})", advice)


def check_links() -> Check:
    """Can this machine put ranks behind rate-limited links (notebooks 8, 12 and 14)? If not, which sections replay
    recorded runs instead, and the way out."""
    from .studies.recorded import links_report

    report = links_report()
    if report is None:
        return Check("links", PASS, "rate-limited links can be built here (user and network namespaces)")
    return Check("links", INFO, report["seen"], report["advice"])


def _child() -> None:  # a module-level function: spawn and forkserver must import it
    pass


def check_start_method(method: str) -> Check:
    name = f"start method {method}"
    if method not in multiprocessing.get_all_start_methods():
        return Check(
            name,
            FAIL if method == "spawn" else INFO,
            "not offered by this platform",
            "spawn is what the lab uses" if method == "spawn" else "",
        )
    try:
        context: Any = multiprocessing.get_context(method)
        process = context.Process(target=_child)
        process.start()
        process.join(30)
        ok = process.exitcode == 0
    except Exception as exc:
        return Check(
            name,
            FAIL,
            f"{type(exc).__name__}: {exc}",
            f"processes cannot be started with {method!r}: check ulimit -u, security software, or "
            "run from a terminal rather than an IDE's restricted console",
        )
    return Check(
        name,
        PASS if ok else FAIL,
        "starts a process" if ok else f"child exited with {process.exitcode}",
        ""
        if ok
        else f"processes started with {method!r} die at once: run the selfcheck in a terminal to see their error",
    )


def check_gloo_allreduce() -> Check:
    from .launcher import WorkerError, selfcheck

    try:
        report = selfcheck(world_size=2, timeout_s=60)
    except (WorkerError, ValueError, OSError) as exc:
        return Check(
            "2-rank gloo all-reduce",
            FAIL,
            str(exc).splitlines()[0],
            "run `python -m commhooks_lab selfcheck` for the full error; GLOO_SOCKET_IFNAME=lo often fixes "
            "hostnames that resolve off the machine",
        )
    seen = f"ranks hold {report['sums']}, expected {report['expected']:g}"
    return Check(
        "2-rank gloo all-reduce",
        PASS if report["ok"] else FAIL,
        seen,
        "" if report["ok"] else "the ranks disagree: report this machine's torch build",
    )


#: ipywidgets 8 talks to the JupyterLab extension jupyterlab_widgets 3; 7 to 1. Otherwise the page
#: shows "Error displaying widget" and no dashboard.
WIDGET_FRONTENDS = {"8": "3", "7": "1"}


def check_widgets() -> Check:
    widgets, frontend = _version("ipywidgets"), _version("jupyterlab_widgets")
    if widgets is None:
        return Check("ipywidgets", FAIL, "not installed", "pip install 'ipywidgets>=8'")
    wanted = WIDGET_FRONTENDS.get(widgets.split(".")[0])
    seen = f"ipywidgets {widgets}, jupyterlab_widgets {frontend or 'missing'}"
    if frontend is None or wanted is None or frontend.split(".")[0] != wanted:
        return Check(
            "ipywidgets",
            FAIL,
            seen,
            f"the dashboard would show 'Error displaying widget': pip install "
            f"'jupyterlab_widgets>={wanted or '3'},<{int(wanted or '3') + 1}' (matching ipywidgets {widgets})",
        )
    return Check("ipywidgets", PASS, seen)


def bqplot_frontends() -> list[str]:
    """Versions of bqplot's JupyterLab extension where JupyterLab looks for extensions (``jupyter --paths``)."""
    import json

    from jupyter_core.paths import jupyter_path

    found = []
    for folder in jupyter_path("labextensions"):
        package = Path(folder) / "bqplot" / "package.json"
        if package.is_file():
            found.append(json.loads(package.read_text())["version"])
    return found


def check_bqplot() -> Check:
    """The dashboard's figures are bqplot widgets: without its front-end a browser shows no figure."""
    try:
        import bqplot
    except ImportError:
        return Check("bqplot", FAIL, "not installed", "pip install bqplot (the dashboard's figures)")
    wanted = bqplot.Figure.class_traits()["_model_module_version"].default_value  # e.g. "^0.6.1"
    frontends = bqplot_frontends()
    seen = f"bqplot {_version('bqplot')}, front-end {', '.join(frontends) or 'missing'} (wants {wanted})"
    major_minor = wanted.lstrip("^~").split(".")[:2]
    if not any(f.split(".")[:2] == major_minor for f in frontends):
        return Check(
            "bqplot",
            FAIL,
            seen,
            "the dashboard's figures would not render: reinstall bqplot in the environment JupyterLab runs from "
            "(pip install --force-reinstall bqplot), then restart JupyterLab",
        )
    return Check("bqplot", PASS, seen)


def check_matplotlib() -> Check:
    try:
        import matplotlib
    except ImportError:
        return Check("matplotlib", FAIL, "not installed", "pip install matplotlib")
    return Check("matplotlib", PASS, f"{matplotlib.__version__}, backend {matplotlib.get_backend()}")


def check_nbval() -> Check:
    version = _version("nbval")
    if version is None:
        return Check("nbval", FAIL, "not installed", "pip install nbval (needed to check the course's notebooks)")
    return Check("nbval", PASS, version)


def check_numerics() -> Check:
    """Does this machine compute the bits the committed notebook outputs were made with? Computed, then compared."""
    from .launcher import fingerprint, numerics

    seen = fingerprint.in_child()
    problems = fingerprint.differences(seen)
    where = f"{numerics.mode()} numerics, ATen {seen['aten_kernels']} kernels"
    if not problems:
        other = fingerprint.other_build(seen)
        return Check(
            "reference numbers",
            PASS,
            f"the same bits as the reference machine in all {len(seen['parts'])} parts ({where}"
            + (f"; {other})" if other else ")"),
        )
    advice = (
        "the notebooks run, but their numbers differ in the last digits from the committed outputs, so strict "
        "nbval fails here: check them with `pytest --lab-tolerant` (commhooks_lab.testing)"
    )
    if numerics.mode() == numerics.NATIVE:
        advice = (
            f"unset {numerics.MODE_VARIABLE} (portable numerics give the reference bits on any x86-64 CPU with "
            "AVX2); " + advice
        )
    elif seen["aten_kernels"] == "DEFAULT":
        advice = (
            "this CPU has no AVX2, so portable numerics run their pre-AVX2 tier (ATen's plain kernels, oneDNN at "
            "SSE4.1), whose bits are not the committed outputs' (made in the AVX2 tier); " + advice
        )
    return Check("reference numbers", INFO, f"{where}: " + "; ".join(problems), advice)


def all_checks() -> list[Callable[[], Check]]:
    return [
        check_python,
        check_torch,
        check_accelerator,
        check_bf16_hook,
        check_machine,
        check_rendezvous,
        check_private_network,
        check_links,
        lambda: check_start_method("spawn"),
        lambda: check_start_method("forkserver"),
        check_gloo_allreduce,
        check_numerics,
        check_widgets,
        check_bqplot,
        check_matplotlib,
        check_nbval,
    ]


def run_checks(checks: list[Callable[[], Check]] | None = None) -> list[Check]:
    """Run every check; one that crashes is reported as a failure, never hides the rest."""
    results = []
    for check in checks or all_checks():
        try:
            results.append(check())
        except Exception as exc:
            name = getattr(check, "__name__", "check").replace("check_", "")
            results.append(Check(name, FAIL, f"{type(exc).__name__}: {exc}", "report this with the table above"))
    return results


def format_table(results: list[Check]) -> str:
    width = max(len(r.name) for r in results)
    lines = [
        f"{r.status:<4}  {r.name:<{width}}  {r.seen}"
        + (f"\n{'':<6}{'':<{width}}  -> {r.advice}" if r.advice and r.status != PASS else "")
        for r in results
    ]
    failed = sum(r.status == FAIL for r in results)
    lines.append(f"\n{failed} of {len(results)} checks failed" if failed else f"\nall {len(results)} checks passed")
    return "\n".join(lines)


def main() -> int:
    results = run_checks()
    print(format_table(results))
    return 1 if any(r.status == FAIL for r in results) else 0
