"""The lab's ``%%ddp`` magics side by side with nbdistributed's, on the same notebook job (issue #25, item 4).

Each tool runs in a fresh interpreter per repeat (interleaved: lab, nbdistributed, lab, ...), the lab under this
Python and nbdistributed under ``--nbd-python`` (a venv of its own), and drives an IPython ``InteractiveShell`` as a
notebook does: ``%load_ext``, 2 ranks (gloo, CPU), then cells, each timed from its start to its end:

1. **Start-up**: ``%load_ext`` + the start magic; the start magic to 2 ranks ready (the lab: when it returns;
   nbdistributed: when both workers hold a connection to the kernel's ZMQ socket, polled with psutil, since its
   ``%dist_init`` returns after a fixed 2 s sleep); a first ``print(rank)`` sent as soon as the start magic returns,
   as Run All sends it, and how long until a cell is answered by both ranks.
2. **Cells**: the job (a DDP MLP 784-256-10 built in the cell and ``--steps`` SGD steps on seeded random data, as in
   ``bench/launch.py``), ``--job-repeats`` times; ``print(rank)``, ``--cell-repeats`` times.
3. **A rank error** (rank 1 divides by zero): what the user sees, whether the cell fails (which stops Run All), when
   the error shows, whether the other rank and the namespaces survive.
4. **A hang** (rank 0 enters a barrier rank 1 never joins) under each tool's timeout (``--timeout`` where there is
   one; ``--hang-cap`` interrupts a cell that outlasts it), the next cell, the stop magic, and what is still running
   after the stop and after the interpreter exits (the bench ends what is left, each by its PID).

nbdistributed's ``%dist_shutdown`` holds ``pkill -f worker.py``, ``pkill -9 -f "python.*worker"`` (anyone's
processes, on a shared machine) and a ``killpg`` of its workers' process group: every interpreter here runs in a
session of its own, with a ``pkill`` first on ``PATH`` that only writes down what it was asked. Its workers start
as ``python worker.py`` from ``PATH``, so ``--nbd-python``'s folder goes on ``PATH`` too. Make its venv with:

    python3 -m venv /tmp/nbd-venv
    /tmp/nbd-venv/bin/pip install -c constraints/py3.11.txt torch==2.13.0 ipython numpy psutil pyzmq
    /tmp/nbd-venv/bin/pip install --no-deps nbdistributed==0.1.0   # it asks for 'jupyter', which it never imports

    python bench/nbdistributed.py [--nbd-python /tmp/nbd-venv/bin/python] [--repeats 3] [--timeout 10]
"""

from __future__ import annotations

import _thread
import argparse
import contextlib
import io
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH)
from _fresh import CHILD_ENV, ROOT  # noqa: E402

LAB, NBD = "commhooks_lab", "nbdistributed"
TOOLS = {
    LAB: {
        "load": "%load_ext commhooks_lab",
        "start": "%ddp start -n 2",
        "cell": "%%ddp",
        "hang": "%%ddp --timeout {timeout:g}",
        "stop": "%ddp stop",
    },
    NBD: {
        "load": "%load_ext nbdistributed",
        "start": "%dist_init -n 2",
        "cell": "%%distributed",
        "hang": "%%distributed",  # no timeout option: CommunicationManager.send_to_all's 30 s
        "stop": "%dist_shutdown",
    },
}
JOB = """\
import torch.nn as nn

torch.manual_seed(0)
model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10)))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
gen = torch.Generator().manual_seed(rank)
for _ in range({steps}):
    x, y = torch.randn(32, 784, generator=gen), torch.randint(0, 10, (32,), generator=gen)
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
print(f"weights {{sum(p.sum().item() for p in model.parameters()):.6f}}")
"""
TRIVIAL = "print(rank)"
ERROR = "if rank == 1:\n    1 / 0\nprint('fine')"
HANG = "if rank == 0:\n    dist.barrier()"
AFTER_HANG = "print(rank, 'kept' in globals())"
ANSI = re.compile(r"\x1b\[[0-9;]*m")
ERROR_MARK = re.compile(r"Error|Traceback|Timeout")
#: The lines that say what went wrong: an exception's last line, nbdistributed's messages.
MESSAGE = re.compile(r"^(\w+Error: |Error executing|Warning: |❌ )")
#: nbdistributed displays a Javascript object (its timeline) after every cell; a notebook runs it unseen.
JS_LINE = "<IPython.core.display.Javascript object>"
PKILL_STUB = '#!/bin/sh\necho "pkill $*" >> "$NBD_BENCH_PKILL_LOG"\nexit 1\n'


# -- in the driven interpreter ------------------------------------------------------------------------------------
class _Capture(io.StringIO):
    """What a cell printed, each piece with the time it came."""

    def __init__(self) -> None:
        super().__init__()
        self.pieces: list[tuple[float, str]] = []

    def write(self, text: str) -> int:
        self.pieces.append((time.perf_counter(), text))
        return super().write(text)


def _cell(shell, code: str, cap_s: float | None = None) -> dict:
    """Run a cell as a notebook does; its time, whether it failed, what it showed and when the first error showed."""
    capture = _Capture()
    timer = threading.Timer(cap_s, _thread.interrupt_main) if cap_s else None
    start = time.perf_counter()
    interrupted = False
    with contextlib.redirect_stdout(capture), contextlib.redirect_stderr(capture):
        if timer is not None:
            timer.start()
        try:
            result = shell.run_cell(code)
            failed = not result.success
            interrupted = isinstance(result.error_in_exec, KeyboardInterrupt)
        except KeyboardInterrupt:
            failed = interrupted = True
        finally:
            if timer is not None:
                timer.cancel()
    seconds = time.perf_counter() - start
    error_s = next((t - start for t, piece in capture.pieces if ERROR_MARK.search(ANSI.sub("", piece))), None)
    lines = [line for line in ANSI.sub("", capture.getvalue()).splitlines() if line.strip() != JS_LINE]
    return {"s": seconds, "failed": failed, "interrupted": interrupted, "error_s": error_s, "text": "\n".join(lines)}


def _shows(tool: str, text: str, rank: int, value: str) -> bool:
    """Whether the cell's output shows ``value`` printed by ``rank``, as the tool labels it."""
    if tool == LAB:  # "[rank 1]\nvalue" or, printed alike by several, "[ranks 0, 1]\nvalue"
        return any(
            str(rank) in m.group(1).split(", ") and m.group(2).strip() == value
            for m in re.finditer(r"^\[ranks? ([\d, ]+)\]\n(.*)$", text, re.M)
        )
    # "🔹 Rank 1:" then the rank's output, indented; each piece a print writes comes on a line of its own
    # (``print(1, True)`` shows "1" and "True" on two lines), so the block's lines are joined by spaces.
    blocks = re.finditer(r"^\W*Rank (\d+):\n((?:[ \t]+\S.*\n?)*)", text, re.M)
    return any(int(m.group(1)) == rank and " ".join(m.group(2).split()) == value for m in blocks)


def _both(tool: str, text: str) -> bool:
    """Whether both ranks answered ``print(rank)``."""
    return _shows(tool, text, 0, "0") and _shows(tool, text, 1, "1")


def _drive(tool: str, out_path: str, args: argparse.Namespace) -> None:
    """One fresh kernel's worth: start, cells, an error, a hang, stop; written to ``out_path`` after each phase."""
    import importlib.metadata

    import psutil
    from IPython.core.interactiveshell import InteractiveShell

    # This file is bench/nbdistributed.py: with bench/ on sys.path, ``%load_ext nbdistributed`` would import it.
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != BENCH]
    spec, me = TOOLS[tool], psutil.Process()
    shell = InteractiveShell.instance(colors="nocolor")
    report: dict = {"tool": tool, "version": importlib.metadata.version(tool), "seen": {}}
    report["torch"] = importlib.metadata.version("torch")

    def cell(code: str, magic: str | None = None, cap_s: float | None = None) -> dict:
        return _cell(shell, f"{magic or spec['cell']}\n{code}", cap_s)

    def save() -> None:
        for proc in me.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                report["seen"][str(proc.pid)] = [proc.create_time(), " ".join(proc.cmdline())[:160]]
        with open(out_path + ".part", "w") as f:
            json.dump(report, f)
        os.replace(out_path + ".part", out_path)

    def rank_pids() -> list[int]:
        if tool == LAB:
            from commhooks_lab.launcher import session

            return [pid for cluster in session.active() for pid in cluster.pids]
        magic = shell.magics_manager.registry.get("DistributedMagic")
        manager = getattr(magic, "_process_manager", None)
        return [p.pid for p in manager.processes] if manager else []

    def alive(pids: list[int]) -> list[int]:
        out = []
        for pid in pids:
            with contextlib.suppress(psutil.Error):
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    out.append(pid)
        return out

    def nbd_connected() -> int:
        """nbdistributed's workers that hold a TCP connection to the kernel's ZMQ port (their last argument)."""
        count = 0
        for proc in me.children():
            with contextlib.suppress(psutil.Error, ValueError, IndexError):
                cmd = proc.cmdline()
                if cmd[1].endswith("worker.py"):
                    port = int(cmd[6])
                    conns = proc.net_connections("tcp")
                    count += any(
                        c.status == psutil.CONN_ESTABLISHED and c.raddr and c.raddr.port == port for c in conns
                    )
        return count

    # 1. start-up
    load = _cell(shell, spec["load"])
    if load["failed"] or "Error" in load["text"]:
        raise SystemExit(f"{spec['load']} failed:\n{load['text']}")
    ready: dict = {}
    done = threading.Event()

    def poll(since: float) -> None:
        while not done.is_set() and time.perf_counter() - since < args.hang_cap:
            if nbd_connected() >= 2:
                ready["s"] = time.perf_counter() - since
                return
            time.sleep(0.02)

    since = time.perf_counter()
    poller = threading.Thread(target=poll, args=(since,), daemon=True)
    if tool == NBD:
        poller.start()
    start = _cell(shell, spec["start"])
    first = cell(TRIVIAL, cap_s=args.hang_cap)
    answered = [first]
    while not _both(tool, answered[-1]["text"]) and len(answered) < 3:
        answered.append(cell(TRIVIAL, cap_s=args.hang_cap))
    answered_s = time.perf_counter() - since if _both(tool, answered[-1]["text"]) else None
    done.set()
    ranks = rank_pids()
    listening = set()
    for proc in [me, *me.children(recursive=True)]:
        role = "kernel" if proc.pid == me.pid else "rank" if proc.pid in ranks else "helper"
        with contextlib.suppress(psutil.Error):
            for conn in proc.net_connections("inet"):
                if conn.status == psutil.CONN_LISTEN:
                    anywhere = " (all interfaces)" if conn.laddr.ip in ("0.0.0.0", "::") else ""
                    listening.add(f"{role} {conn.laddr.ip}{anywhere}")
    report["start"] = {
        "load_start_s": load["s"] + start["s"],
        "start_s": start["s"],
        "ready_s": start["s"] if tool == LAB else ready.get("s"),
        "start_text": start["text"],
        "first": first,
        "first_answered": _both(tool, first["text"]),
        "answered_s": answered_s,
        "tries": len(answered),
        "listening": sorted(listening),
        "ranks": ranks,
    }
    save()

    # 2. cells
    job = [cell(JOB.format(steps=args.steps)) for _ in range(args.job_repeats)]
    for run in job:
        sums = set(re.findall(r"weights (-?\d+\.\d+)", run["text"]))
        run["ok"] = not run["failed"] and len(sums) == 1 and "Error" not in run["text"]
    trivial = [cell(TRIVIAL) for _ in range(args.cell_repeats)]
    for run in trivial:
        run["ok"] = _both(tool, run["text"])
    report["job"], report["trivial"] = job, trivial
    save()

    # 3. a rank error
    cell("kept = rank * 10")
    ranks = rank_pids()
    error = cell(ERROR)
    error["ranks_alive"] = len(alive(ranks))
    follow = cell("print(kept)")
    error["namespaces_kept"] = _shows(tool, follow["text"], 0, "0") and _shows(tool, follow["text"], 1, "10")
    error["fine_shown"] = _shows(tool, error["text"], 0, "fine")
    report["error"] = error
    save()

    # 4. a hang, the next cell, stop
    ranks = rank_pids()
    hang = cell(HANG, spec["hang"].format(timeout=args.timeout), cap_s=args.hang_cap)
    hang["ranks_alive"] = len(alive(ranks))
    report["hang"] = hang
    save()
    after = cell(AFTER_HANG, cap_s=args.hang_cap)
    after["answered"] = [
        r for r in (0, 1) if any(_shows(tool, after["text"], r, f"{r} {k}") for k in ("True", "False"))
    ]
    after["kept"] = [r for r in (0, 1) if _shows(tool, after["text"], r, f"{r} True")]
    report["after_hang"] = after
    ranks = sorted(set(ranks) | set(rank_pids()))
    save()
    stop = _cell(shell, spec["stop"], cap_s=args.hang_cap)
    time.sleep(1.0)  # let what stops, stop
    stop["ranks_left"] = len(alive(ranks))
    stop["left"] = [" ".join(p.cmdline())[:90] for p in me.children(recursive=True) if alive([p.pid])]
    report["stop"] = stop
    save()


# -- in the bench's own interpreter -------------------------------------------------------------------------------
def run_driver(tool: str, python: str, args: argparse.Namespace, scratch: str) -> dict:
    """One fresh interpreter driving ``tool``; its report, with what it left running (ended here, by PID)."""
    out = os.path.join(scratch, f"{tool}-{time.monotonic_ns()}.json")
    env = {**os.environ, **CHILD_ENV, "NBD_BENCH_PKILL_LOG": os.path.join(scratch, f"pkill-{tool}.log")}
    stub = os.path.join(scratch, "bin")
    path = [stub, os.path.dirname(python)] if tool == NBD else [stub]
    env["PATH"] = os.pathsep.join([*path, env.get("PATH", "")])
    if tool == LAB:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")]))
    else:
        env.pop("PYTHONPATH", None)
    options = [f"--{k.replace('_', '-')}={getattr(args, k)}" for k in ("steps", "job_repeats", "cell_repeats")]
    options += [f"--timeout={args.timeout}", f"--hang-cap={args.hang_cap}"]
    command = [python, os.path.abspath(__file__), "--driver", tool, "--out", out, *options]
    with open(out + ".log", "w") as log:
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=log, start_new_session=True)
        try:
            proc.wait(timeout=args.driver_timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    report: dict = {"tool": tool, "seen": {}}
    if os.path.exists(out):
        with open(out) as f:
            report = json.load(f)
    report["exit_code"] = proc.returncode
    if proc.returncode != 0:
        with open(out + ".log") as f:
            report["log_tail"] = f.read()[-1500:]
    report["left_after_exit"] = end_leftovers(report["seen"], args.exit_grace)
    return report


def end_leftovers(seen: dict, grace_s: float) -> list[str]:
    """The driver's descendants still running ``grace_s`` after it exited: ended here, each by its PID (and start
    time, so that a reused PID is left alone)."""
    import psutil

    def running() -> list:
        procs = []
        for pid, (created, cmd) in seen.items():
            with contextlib.suppress(psutil.Error):
                proc = psutil.Process(int(pid))
                if abs(proc.create_time() - created) < 0.01 and proc.status() != psutil.STATUS_ZOMBIE:
                    procs.append((proc, cmd))
        return procs

    deadline = time.monotonic() + grace_s
    while running() and time.monotonic() < deadline:
        time.sleep(0.1)
    left = running()
    for proc, _ in left:
        with contextlib.suppress(psutil.Error):
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(5)
    return [cmd[:90] for _, cmd in left]


def _values(reports: list[dict], fn) -> list[float]:
    out = []
    for report in reports:
        with contextlib.suppress(KeyError, TypeError, IndexError):
            value = fn(report)
            out.extend(v for v in (value if isinstance(value, list) else [value]) if v is not None)
    return out


def _timing(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.2f} s ({min(values):.2f} / {max(values):.2f})"


def _count(reports: list[dict], fn, what: str) -> str:
    flags = _values(reports, fn)
    return f"{sum(bool(f) for f in flags)}/{len(flags)} {what}" if flags else "-"


def _line(reports: list[dict], fn) -> str:
    """The first repeat's text, as one short line."""
    for report in reports:
        with contextlib.suppress(KeyError, TypeError):
            text = " / ".join(line.strip() for line in fn(report).splitlines() if line.strip())
            text = text.replace("|", "\\|")
            return (text[:200] + "...") if len(text) > 200 else text or "(nothing)"
    return "-"


def _messages(text: str) -> str:
    return "\n".join(line.strip() for line in text.splitlines() if MESSAGE.match(line.strip()))


def _first_lines(text: str, n: int = 14) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    shown = lines[:n] + (["...", lines[-1]] if len(lines) > n + 1 else lines[n:])
    return textwrap.indent("\n".join(shown) or "(nothing)", "    ")


def table(reports: dict[str, list[dict]], args: argparse.Namespace) -> str:
    lab, nbd = reports[LAB], reports[NBD]
    timings = [
        ("start-up: `%load_ext` + start magic (until it returns)", lambda r: r["start"]["load_start_s"]),
        ("start-up: start magic to 2 ranks ready", lambda r: r["start"]["ready_s"]),
        ("start-up: start magic to a cell answered by both ranks", lambda r: r["start"]["answered_s"]),
        ("first cell, sent as the start magic returns", lambda r: r["start"]["first"]["s"]),
        (f"job cell (DDP init + {args.steps} steps), first", lambda r: r["job"][0]["s"]),
        ("job cell, again", lambda r: [c["s"] for c in r["job"][1:]]),
        ("`print(rank)` cell", lambda r: [c["s"] for c in r["trivial"]]),
        ("rank error: until the error shows", lambda r: r["error"]["error_s"]),
        ("rank error: until the cell returns", lambda r: r["error"]["s"]),
        ("hang: until the timeout shows", lambda r: r["hang"]["error_s"]),
        ("hang: until the cell returns", lambda r: r["hang"]["s"]),
        ("next cell after the hang", lambda r: r["after_hang"]["s"]),
        ("stop magic", lambda r: r["stop"]["s"]),
    ]
    rows = ["| measure | commhooks_lab | nbdistributed | nbdistributed / commhooks_lab |", "|---|---|---|---|"]
    versions = [_line(r, lambda x: f"{x['version']} (torch {x['torch']})") for r in (lab, nbd)]
    rows.append(f"| version | {versions[0]} | {versions[1]} | |")
    for label, fn in timings:
        a, b = _values(lab, fn), _values(nbd, fn)
        ratio = f"{statistics.median(b) / statistics.median(a):.2f}x" if a and b and statistics.median(a) else ""
        rows.append(f"| {label} | {_timing(a)} | {_timing(b)} | {ratio} |")
    facts = [
        ("first cell answered by both ranks", lambda r: _count(r, lambda x: x["start"]["first_answered"], "yes")),
        ("job cell ran on both ranks, weights equal", lambda r: _count(r, lambda x: [c["ok"] for c in x["job"]], "ok")),
        ("`print(rank)` answered by both ranks", lambda r: _count(r, lambda x: [c["ok"] for c in x["trivial"]], "ok")),
        ("listening sockets while running", lambda r: _line(r, lambda x: ", ".join(x["start"]["listening"]))),
        ("rank error: the cell fails (stops Run All)", lambda r: _count(r, lambda x: x["error"]["failed"], "yes")),
        ("rank error: rank 0's own output shown", lambda r: _count(r, lambda x: x["error"]["fine_shown"], "yes")),
        ("rank error: both ranks alive after", lambda r: _count(r, lambda x: x["error"]["ranks_alive"] == 2, "yes")),
        ("rank error: namespaces kept", lambda r: _count(r, lambda x: x["error"]["namespaces_kept"], "yes")),
        ("rank error: what it says", lambda r: _line(r, lambda x: _messages(x["error"]["text"]))),
        ("hang: timeout", lambda r: _hang_timeout(r, args)),
        ("hang: the cell fails", lambda r: _count(r, lambda x: x["hang"]["failed"], "yes")),
        ("hang: interrupted by the bench's cap", lambda r: _count(r, lambda x: x["hang"]["interrupted"], "yes")),
        ("hang: what it says", lambda r: _line(r, lambda x: _messages(x["hang"]["text"]))),
        ("next cell after the hang: what it says", lambda r: _line(r, lambda x: _messages(x["after_hang"]["text"]))),
        ("hang: ranks alive after the cell", lambda r: _line(r, lambda x: f"{x['hang']['ranks_alive']} of 2")),
        ("next cell after the hang: ranks answering", lambda r: _line(r, lambda x: str(x["after_hang"]["answered"]))),
        ("next cell after the hang: namespace kept on", lambda r: _line(r, lambda x: str(x["after_hang"]["kept"]))),
        ("after the stop magic: ranks still running", lambda r: _line(r, lambda x: f"{x['stop']['ranks_left']}")),
        ("after the stop magic: processes running", lambda r: _line(r, lambda x: "; ".join(x["stop"]["left"]))),
        (
            f"{args.exit_grace:g} s after the interpreter exits: left running",
            lambda r: _line(r, lambda x: "; ".join(x["left_after_exit"])),
        ),
        ("`pkill` calls (stubbed, never run)", lambda r: _line(r, lambda x: "; ".join(x["pkill"]) or "none")),
    ]
    for label, fn in facts:
        rows.append(f"| {label} | {fn(lab)} | {fn(nbd)} | |")
    return "\n".join(row.replace("|  |", "| |") for row in rows)


def _hang_timeout(reports: list[dict], args: argparse.Namespace) -> str:
    if not reports:
        return "-"
    if reports[0]["tool"] == LAB:
        return f"{args.timeout:g} s (`%%ddp --timeout {args.timeout:g}`; default 30 s)"
    return "fixed 30 s (send_to_all's default; no magic option)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nbd-python", default="/tmp/nbd-venv/bin/python")
    parser.add_argument("--repeats", type=int, default=3, help="fresh interpreters per tool")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--job-repeats", type=int, default=3)
    parser.add_argument("--cell-repeats", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=10.0, help="the hang cell's timeout, where a tool has one")
    parser.add_argument("--hang-cap", type=float, default=120.0, help="interrupt any cell after this long")
    parser.add_argument("--driver-timeout", type=float, default=900.0)
    parser.add_argument("--exit-grace", type=float, default=5.0, help="what still runs this long after exit is left")
    parser.add_argument("--driver", choices=sorted(TOOLS), help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.driver:
        _drive(args.driver, args.out, args)
        return
    pythons = {LAB: sys.executable, NBD: args.nbd_python}
    if not os.path.exists(args.nbd_python):
        sys.exit(f"no {args.nbd_python}: make nbdistributed's venv first (see this script's docstring)")
    reports: dict[str, list[dict]] = {LAB: [], NBD: []}
    with tempfile.TemporaryDirectory(prefix="nbd-bench-") as scratch:
        os.makedirs(os.path.join(scratch, "bin"))
        stub = os.path.join(scratch, "bin", "pkill")
        with open(stub, "w") as f:
            f.write(PKILL_STUB)
        os.chmod(stub, 0o755)
        for i in range(args.repeats):
            for tool, python in pythons.items():
                started = time.perf_counter()
                report = run_driver(tool, python, args, scratch)
                log = os.path.join(scratch, f"pkill-{tool}.log")
                report["pkill"] = open(log).read().splitlines() if os.path.exists(log) else []
                with contextlib.suppress(FileNotFoundError):
                    os.remove(log)
                reports[tool].append(report)
                status = "ok" if report["exit_code"] == 0 else f"exit code {report['exit_code']}"
                print(f"repeat {i + 1}/{args.repeats} {tool:<14} {time.perf_counter() - started:6.1f} s  {status}")
                if report.get("log_tail"):
                    print(textwrap.indent(report["log_tail"], "    "))
    print(
        f"\n2 ranks, gloo on CPU, {args.repeats} fresh interpreters per tool ({os.cpu_count()} cores); "
        "timings: median (min / max) over every repeat's cells\n"
    )
    print(table(reports, args))
    for tool in (LAB, NBD):
        first = reports[tool][0]
        print(f"\n### what {tool} shows (first repeat)")
        for label, fn in [
            ("start magic", lambda r: r["start"]["start_text"]),
            ("first cell, sent as the start magic returns", lambda r: r["start"]["first"]["text"]),
            ("rank error cell", lambda r: r["error"]["text"]),
            ("hang cell", lambda r: r["hang"]["text"]),
            ("next cell after the hang", lambda r: r["after_hang"]["text"]),
            ("stop magic", lambda r: r["stop"]["text"]),
        ]:
            with contextlib.suppress(KeyError):
                print(f"\n{label}:\n{_first_lines(fn(first))}")


if __name__ == "__main__":
    main()
