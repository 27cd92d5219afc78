"""A submission scored where it cannot hurt the scorer: a child process of its own, outside the scorer's code.

The scorer (this module's :func:`score_file`, in the learner's or instructor's process) never imports a
submission. It screens the source (:mod:`.screen`), copies it into a new private folder, and starts
``python -m commhooks_lab.challenge.sandbox FOLDER FD TASKS`` there:

- in a session of its own (``setsid``), with ``resource.setrlimit`` budgets that its ranks inherit: data memory
  (:attr:`Budget.memory_bytes`), CPU seconds, the size of any file it writes, no core files;
- where user namespaces are allowed, under ``unshare --user --net --pid --fork --kill-child``: no network but its
  own loopback (its ranks then get the lab's private network inside it), and a PID namespace, so that every
  process it starts, forked ones included, dies with it;
- with its folder as working directory, ``HOME`` and ``TMPDIR``, and a minimal environment;
- its ranks, where ``rank_python`` names an interpreter (a wrapper that runs Python under ``qemu-x86_64 -cpu
  Haswell-v4``, say), spawned with it: the leaderboard made on another CPU, to compare with this one's;
- for at most :attr:`Budget.wall_s` seconds of wall-clock time, and :attr:`Budget.stall_s` without a finished
  step; then its whole session is killed.

The child scores the hook with :func:`.score.score` on fresh ranks and writes the Score's JSON to a pipe; the
scorer reads at most :data:`MAX_REPORT_BYTES` of it, parses it with the lab's bounded JSON reader, and turns
every failure (a budget exceeded, a crash, a malformed report) into a disqualification with its reason.
"""

from __future__ import annotations

import dataclasses
import json
import os
import resource
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..engine.seed_set import SEED_SET_VARIABLE
from ..launcher import numerics
from ..launcher.store import CHECKED_ABOVE_VARIABLE, no_one_else_can_move
from ..safe_files import Folder, parse_json
from .score import Score, first_lines, lab_versions, task_set_name
from .screen import screen
from .submission import MODULE, Submission, read_submission
from .tasks import TASKS, ChallengeTask, tasks_of

__all__ = ["Budget", "DEFAULT_BUDGET", "isolation", "main", "score_file", "score_submission"]

MAX_REPORT_BYTES = 1 << 20
#: How much of the child's log a disqualification quotes.
LOG_TAIL = 1200


@dataclass(frozen=True)
class Budget:
    """What one submission may spend: wall-clock and CPU seconds, seconds without a finished step, memory."""

    wall_s: float = 600.0
    stall_s: float = 60.0
    memory_bytes: int = 3 << 30
    file_bytes: int = 64 << 20


#: The variables a score's bits depend on (the seed set, the numerics mode, the kernels ATen, MKL and oneDNN pick,
#: the threads): a sandbox keeps the scorer's, so that it scores what the learner's kernel scores.
_BITS_DEPEND_ON = (SEED_SET_VARIABLE, numerics.MODE_VARIABLE, *numerics.PORTABLE_VARIABLES, *numerics.ONE_THREAD)

#: The budget every submission gets unless a caller (a test) gives another.
DEFAULT_BUDGET = Budget()

#: ``--mount-proc``: a ``/proc`` of the new PID namespace, whose process numbers the ranks' own private network
#: names (``ip link ... netns /proc/PID/fd/N``; with the machine's ``/proc`` a link could not be built inside).
_UNSHARE = [
    "unshare", "--user", "--map-root-user", "--net", "--pid", "--fork", "--kill-child", "--mount", "--mount-proc",
]  # fmt: skip

#: Run inside the new mount namespace: its folder stays writable, every other mount becomes read-only (``/proc``,
#: the PID namespace's own, stays writable: the ranks' own private network writes its user namespace's maps there),
#: and ``/dev/shm`` is a new tmpfs of its own; its network namespace's loopback comes up (ranks spawned with
#: ``rank_python`` meet on it; forked ones make a private network of their own). ``$1``: the folder; the rest: the
#: command.
_READ_ONLY_BUT_ITS_FOLDER = r"""set -e
F="$1"; shift
ip link set lo up 2>/dev/null || true
mount --bind "$F" "$F"
while read -r dev mnt rest; do
  mnt=$(printf '%b' "$mnt")
  case "$mnt" in "$F"|/proc|/proc/*|/dev/shm) continue;; esac
  mount -o remount,bind,ro "$mnt" 2>/dev/null || true
done < /proc/self/mounts
mount -t tmpfs -o size=256m tmpfs /dev/shm
exec "$@"
"""


def _isolated(folder: str) -> list[str]:
    return [*_UNSHARE, "sh", "-c", _READ_ONLY_BUT_ITS_FOLDER, "sandbox", folder]


def isolation() -> tuple[bool, str]:
    """Whether this machine isolates a submission in namespaces, and what isolation it gets, in words."""
    if shutil.which("unshare"):
        with tempfile.TemporaryDirectory() as folder:
            probe = subprocess.run(
                [*_isolated(folder), "sh", "-c", f"touch {folder}/ok"], capture_output=True, text=True, timeout=30
            )
        if probe.returncode == 0:
            return True, (
                "user, network, PID and mount namespaces: no network but its own loopback, every file system "
                "read-only but its folder, every process it starts killed with it; plus the budgets"
            )
        why = " ".join(probe.stderr.split()) or f"exit status {probe.returncode}"
    else:
        why = "no unshare command"
    return False, (
        f"no namespaces ({why}): the network and the file system are this machine's, guarded by the screen alone; "
        "the budgets (memory, CPU, file size, wall-clock), its own working folder and its session (killed at the "
        "end) still hold"
    )


def _limits(budget: Budget):
    def apply() -> None:
        os.setsid()
        # RLIMIT_DATA, not RLIMIT_AS: a CUDA build of torch maps gigabytes of libraries (address space, not
        # memory) and failed to score fp16 under a 3 GiB RLIMIT_AS; the data limit counts the heap and private
        # anonymous mappings (Linux 4.7+), where tensors live
        resource.setrlimit(resource.RLIMIT_DATA, (budget.memory_bytes, budget.memory_bytes))
        cpu = int(budget.wall_s) + 1
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
        resource.setrlimit(resource.RLIMIT_FSIZE, (budget.file_bytes, budget.file_bytes))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return apply


def _disqualified(
    submission: Submission, reason: str, isolation_note: str = "", tasks: Sequence[ChallengeTask] = TASKS
) -> Score:
    result = Score(submission.label, disqualified=reason, task_set=task_set_name(tasks), versions=lab_versions())
    result.versions["isolation"] = isolation_note
    return result


def _kill_session(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _read_report(fd: int, proc: subprocess.Popen, budget: Budget) -> tuple[bytes, str | None]:
    """What the child wrote to ``fd`` before it exited, and why it was stopped (None: it ended by itself)."""
    data = b""
    deadline = time.monotonic() + budget.wall_s
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return data, f"ran past its time budget of {budget.wall_s:g} s (runs forever?)"
        ready, _, _ = select.select([fd], [], [], min(left, 1.0))
        if ready:
            chunk = os.read(fd, 65536)
            if not chunk:
                return data, None
            data += chunk
            if len(data) > MAX_REPORT_BYTES:
                return data, f"its report is larger than {MAX_REPORT_BYTES} bytes"
        elif proc.poll() is not None:
            return data, None


def _why_it_failed(log: str, returncode: int | None, budget: Budget) -> str:
    tail = first_lines(log[-LOG_TAIL:])
    if "can't allocate memory" in log or "MemoryError" in log or "std::bad_alloc" in log:
        return f"ran out of its memory budget of {budget.memory_bytes / 2**30:g} GiB: {tail}"
    if returncode == -signal.SIGXCPU or returncode == 128 + signal.SIGXCPU:
        return f"ran past its CPU budget of {int(budget.wall_s) + 1} s"
    return f"the scoring process ended without a report (exit status {returncode}): {tail}"


def score_submission(
    submission: Submission,
    tasks: str | Sequence[ChallengeTask] = TASKS,
    budget: Budget = DEFAULT_BUDGET,
    screened: bool = True,
    link: str | None = None,
    rank_python: str | None = None,
) -> Score:
    """``submission`` screened, then scored in a child process of its own (see the module's docstring);
    ``screened=False`` skips the screen, to test the second line alone; ``link``: also timed behind one
    (:mod:`.measured`); ``rank_python``: the interpreter its ranks are spawned with (None: forked natively)."""
    tasks = tasks_of(tasks)
    problems = screen(submission.source) if screened else []
    if problems:
        shown = "; ".join(str(p) for p in problems[:5]) + (
            f"; and {len(problems) - 5} more" if len(problems) > 5 else ""
        )
        return _disqualified(submission, f"refused before it ran: {shown}", "the screen", tasks)
    isolated, note = isolation()
    with tempfile.TemporaryDirectory(prefix="commhooks-challenge-") as scratch:
        scratch_path = Path(scratch)
        own = scratch_path / "submission"
        own.mkdir(mode=0o700)
        (own / "tmp").mkdir(mode=0o700)
        with Folder.open(own, "the lab made this folder") as folder:
            folder.write(f"{MODULE}.py", submission.source.encode())
        log_path = scratch_path / "log.txt"
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(own),
            "TMPDIR": str(own / "tmp"),
            "PYTHONPATH": str(own),
            "PYTHONDONTWRITEBYTECODE": "1",
            "COMMHOOKS_LAB_PREWARM": "0",
            "LANG": "C.UTF-8",
            # what the score's bits depend on, as in the learner's own kernel: a notebook under another seed set,
            # numerics mode or kernel choice and its sandbox then agree (the first two named in the score)
            **{k: os.environ[k] for k in _BITS_DEPEND_ON if k in os.environ},
        }
        if no_one_else_can_move(str(own)):  # checked here, where the owners above it can be read; the child's user
            env[CHECKED_ABOVE_VARIABLE] = str(own)  # namespace reads root's as nobody's (else it fails as it would)
        read_end, write_end = os.pipe()
        where = {"stall_s": budget.stall_s, "link": link, "rank_python": rank_python}
        spec = json.dumps([dataclasses.asdict(t) for t in tasks] + [where])
        prefix = _isolated(str(own)) if isolated else []
        command = [*prefix, sys.executable, "-m", "commhooks_lab.challenge.sandbox", str(own), str(write_end), spec]
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                command,
                cwd=own,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                pass_fds=(write_end,),
                preexec_fn=_limits(budget),
            )
        os.close(write_end)
        try:
            data, stopped = _read_report(read_end, proc, budget)
        finally:
            os.close(read_end)
            _kill_session(proc.pid)
            proc.wait()
        if stopped is not None:
            return _disqualified(submission, stopped, note, tasks)
        log_text = log_path.read_bytes()[-64 * 1024 :].decode("utf-8", errors="replace")
    if not data:
        return _disqualified(submission, _why_it_failed(log_text, proc.returncode, budget), note, tasks)
    try:
        scored = Score.from_dict(parse_json(data, "the sandbox's report", "a submission's report is the lab's JSON"))
    except (ValueError, KeyError, TypeError) as exc:
        return _disqualified(submission, f"its report was malformed ({exc})", note, tasks)
    scored.label = submission.label
    if scored.disqualified and ("can't allocate memory" in scored.disqualified or "MemoryError" in scored.disqualified):
        scored.disqualified = (
            f"ran out of its memory budget of {budget.memory_bytes / 2**30:g} GiB: {scored.disqualified}"
        )
    scored.versions["isolation"] = note
    return scored


def score_file(
    path: str | Path,
    tasks: str | Sequence[ChallengeTask] = TASKS,
    budget: Budget = DEFAULT_BUDGET,
    link: str | None = None,
    rank_python: str | None = None,
) -> Score:
    """The submission at ``path`` (a .py file, or a notebook with cells tagged ``challenge``), scored safely."""
    try:
        submission = read_submission(path)
    except (OSError, ValueError) as exc:
        unread = Submission(Path(path).stem, "")
        return _disqualified(unread, f"not readable as a submission: {exc}", tasks=tasks_of(tasks))
    return score_submission(submission, tasks, budget, link=link, rank_python=rank_python)


# -- the child's side -------------------------------------------------------------------------------------


def _timeout_reason(text: str, stall_s: float) -> str:
    return f"ran past its time budget: no step finished within {stall_s:g} s (runs forever?): {text}"


def _spawned_with(rank_python: str, tasks: Sequence[ChallengeTask], stall_s: float, stack) -> list:
    """Ranks for each shape of ``tasks``, spawned with the interpreter ``rank_python`` (qemu's other CPU, say):
    multiprocessing's spawn runs it for every rank; forkserver would fork this native process instead."""
    import multiprocessing

    from ..launcher import Ranks, RankSpec
    from ..launcher.options import DEFAULT_TIMEOUT_S

    multiprocessing.set_executable(rank_python)
    ranks = stack.enter_context(Ranks(fresh=True))  # the launcher starts them, and stops them at the end
    shapes = dict.fromkeys((task.world_size, task.nodes) for task in tasks)
    # a spawned rank imports torch before it meets the others (20 s under qemu): the stall budget still bounds
    # each run's steps (score's timeout_s), the ranks' start gets at least the lab's default
    start_s = max(stall_s, DEFAULT_TIMEOUT_S)
    return [ranks(RankSpec(size, timeout_s=start_s, start_method="spawn", nodes=nodes)) for size, nodes in shapes]


def main(argv: list[str]) -> int:
    """In the child: score ``submission:hook`` (or the registered hook its ``HOOK_SPEC`` names) on the tasks,
    write the Score's JSON to the given pipe."""
    folder, fd, spec = argv[0], int(argv[1]), json.loads(argv[2])
    os.chdir(folder)
    sys.path.insert(0, folder)
    stall_s, link, rank_python = float(spec[-1]["stall_s"]), spec[-1].get("link"), spec[-1].get("rank_python")
    tasks = tuple(ChallengeTask(**t) for t in spec[:-1])
    import contextlib
    import importlib

    from .score import score

    try:
        module = importlib.import_module(MODULE)
        spec = getattr(module, "HOOK_SPEC", None)  # a registered hook by name: the lab's baselines
        hook = spec if isinstance(spec, str) and not hasattr(module, "hook") else f"{MODULE}:hook"
        state_factory = getattr(module, "make_state", None)
        with contextlib.ExitStack() as stack:
            clusters = _spawned_with(rank_python, tasks, stall_s, stack) if rank_python else []
            result = score(
                hook,
                state_factory=state_factory,
                tasks=tasks,
                cluster=clusters or None,
                fresh=not clusters,
                timeout_s=stall_s,
                link=link,
            )
    except Exception as exc:  # its import failed: the report says so
        reason = f"failed to load: {type(exc).__name__}: {exc}"
        result = Score(MODULE, disqualified=reason, task_set=task_set_name(tasks), versions=lab_versions())
    if result.disqualified and "WorkerTimeoutError" in result.disqualified:
        result.disqualified = _timeout_reason(result.disqualified, stall_s)
    with os.fdopen(fd, "wb") as out:
        out.write(json.dumps(result.to_dict()).encode())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
