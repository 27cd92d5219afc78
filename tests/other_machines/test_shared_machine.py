"""Another account on the same machine can neither touch a learner's ranks nor make them allocate, hang or die.

A workshop server has many learners, each an unprivileged account. The test plays the other account for real: a
child that drops to ``nobody`` (CI runs as root) and, with only the standard library, does what such an account
can: list the rendezvous folder and open its store, connect to every socket the kernel and the ranks listen on
(``/proc/net/tcp`` shows them to anyone), send junk and a header announcing gigabytes, and hold half-open
connections while the learner runs again and starts new ranks. The learner's runs must still pass, give the same
numbers, and nothing may grow.

The attacks on gloo's own listeners (hijacking a pair's handshake, filling a rank's file descriptors) need a
learner that is an unprivileged account too, so that the attacker aims at its listeners only, never at another
test's or at a notebook kernel's: ``tests/other_machines/accounts/`` has both sides, run as two accounts.
"""

import json
import os
import resource
import shutil
import stat
import subprocess
import sys
import sysconfig
import tempfile
import textwrap
import time
from pathlib import Path

import psutil
import pytest

import commhooks_lab as lab
from commhooks_lab import Cluster
from commhooks_lab.launcher.netns_switch import why_unavailable

pytestmark = pytest.mark.usefixtures("no_leftover_processes")

NOBODY = 65534
#: The learner of the gloo attacks: an unprivileged account with no other process on the machine.
LEARNER = 4242
ACCOUNTS = Path(__file__).parent / "accounts"
ROOT = Path(__file__).resolve().parents[2]
SYSTEM_PYTHON = "/usr/bin/python3"  # the attacker's own interpreter: the learner's venv is not its to read
#: What the other account runs (standard library only). argv: rendezvous folder, store path, ports...
ATTACK = textwrap.dedent(
    """
    import json, os, socket, struct, sys, time
    folder, store, ports = sys.argv[1], sys.argv[2], [int(p) for p in sys.argv[3:]]
    seen = {"uid": os.getuid()}
    for what, probe in (("list the rendezvous folder", lambda: os.listdir(folder)),
                        ("read the store", lambda: open(store, "rb").read(16)),
                        ("write the store", lambda: open(store, "ab").write(b"x"))):
        try:
            probe()
            seen[what] = "DONE"
        except OSError as exc:
            seen[what] = type(exc).__name__
    held = []
    for port in ports:
        for payload in (os.urandom(65536), struct.pack("<BQ", 1, 3 << 30) + b"key", b"\\xff" * 64):
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
                    s.sendall(payload)
            except OSError:
                pass
        for _ in range(4):  # half-open: connect, say nothing, keep it open
            try:
                held.append(socket.create_connection(("127.0.0.1", port), timeout=2))
            except OSError:
                pass
    seen["connections held"] = len(held)
    print(json.dumps(seen), flush=True)
    time.sleep(float(os.environ.get("HOLD_S", "20")))
    """
)


def _drop_privileges() -> None:
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)


def _listening_ports(pids: list[int]) -> list[int]:
    ports = set()
    for pid in pids:
        for c in psutil.Process(pid).net_connections("inet"):
            if c.status == psutil.CONN_LISTEN:
                ports.add(c.laddr.port)
    return sorted(ports)


def _rss_mib(pid: int) -> float:
    return psutil.Process(pid).memory_info().rss / 2**20


def _unmapped(uid: int) -> str | None:
    """Why no process here can become ``uid`` though this one is root: a user namespace that maps no such uid (as
    ``unshare -r``, which maps root alone), or None."""
    try:
        rows = [[int(n) for n in line.split()] for line in Path("/proc/self/uid_map").read_text().splitlines()]
    except OSError:
        return None
    if any(inside <= uid < inside + count for inside, _, count in rows):
        return None
    return f"this process runs in a user namespace that maps no uid {uid}: it cannot start one as another account"


def _play_accounts(*uids: int) -> None:
    """Skip, with the reason, where this process cannot start others as ``uids`` or this machine cannot give the
    ranks their private network (these tests check that network: without it the ranks listen on the loopback).
    CI runs as root so that it can."""
    if os.geteuid() != 0:
        if os.environ.get("CI"):
            pytest.fail("CI runs as root so that this test can play other accounts", pytrace=False)
        pytest.skip("needs root to start processes as other accounts")
    for uid in uids:
        if why := _unmapped(uid):
            pytest.skip(why)
    if not os.path.exists(SYSTEM_PYTHON):
        pytest.skip(f"the other accounts need a Python of their own at {SYSTEM_PYTHON}")
    if why := why_unavailable():
        pytest.skip(f"what this test checks is the ranks' private network, and this machine cannot make it: {why}")


@pytest.fixture
def other_account():
    _play_accounts(NOBODY)
    started = []

    def start(folder: str, store: str, ports: list[int], hold_s: float = 20.0) -> tuple[subprocess.Popen, dict]:
        import json

        proc = subprocess.Popen(
            [SYSTEM_PYTHON, "-c", ATTACK, folder, store, *map(str, ports)],
            preexec_fn=_drop_privileges,
            env={"HOLD_S": str(hold_s), "PATH": "/usr/bin:/bin"},
            stdout=subprocess.PIPE,
            text=True,
            cwd="/",
        )
        started.append(proc)
        line = proc.stdout.readline()
        assert line, "the attacker printed nothing"
        return proc, json.loads(line)

    yield start
    for proc in started:
        proc.kill()
        proc.wait()


def test_another_account_cannot_reach_the_rendezvous_or_disturb_a_run(other_account):
    with Cluster(world_size=2) as cluster:
        before = lab.run(hook="fp16", steps=4, cluster=cluster)
        rendezvous = cluster._store[0]
        kernel_rss, ranks_rss = _rss_mib(os.getpid()), [_rss_mib(p) for p in cluster.pids]
        ports = _listening_ports([os.getpid(), *cluster.pids])
        attacker, seen = other_account(rendezvous.folder, rendezvous.path, ports)
        assert seen["uid"] == NOBODY
        assert seen["list the rendezvous folder"] == "PermissionError"
        assert seen["read the store"] == seen["write the store"] == "PermissionError"
        assert ports == [], "the kernel or a rank listens where another account can connect"
        start = time.monotonic()
        after = lab.run(hook="fp16", steps=4, cluster=cluster)  # while the attacker holds its connections
        warm_s = time.monotonic() - start
        assert cluster.alive and cluster.starts == 1
        assert after.final["param_digests"] == before.final["param_digests"]
        assert _rss_mib(os.getpid()) - kernel_rss < 64, "the kernel grew"
        assert all(_rss_mib(p) - r < 64 for p, r in zip(cluster.pids, ranks_rss)), "a rank grew"
        assert warm_s < 10, f"a warm run took {warm_s:.1f} s while another account held connections"
    # and a new Cluster starts while the attacker still holds its half-open connections
    assert attacker.poll() is None
    start = time.monotonic()
    fresh = lab.run(hook="fp16", steps=4, fresh=True)
    assert fresh.final["param_digests"] == before.final["param_digests"]
    assert time.monotonic() - start < 30


@pytest.mark.parametrize("mode, inside", [(0o777, False), (0o1777, True), (0o700, True)])
def test_the_rendezvous_is_made_only_where_no_other_account_can_move_it(tmp_path, monkeypatch, mode, inside):
    """In a 0777 temp folder without the sticky bit another account renamed the rendezvous folder away and made its
    own, open to all, in its place: the ranks' store then lay in it, 786 bytes readable by anyone."""
    from commhooks_lab.launcher.store import PrivateRendezvous

    temp = tmp_path / "temp"
    temp.mkdir()
    os.chmod(temp, mode)
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    rendezvous = PrivateRendezvous()
    try:
        expected = temp if inside else tmp_path / "home" / ".cache" / "commhooks_lab"
        assert Path(rendezvous.folder).parent == expected
        assert stat.S_IMODE(os.stat(rendezvous.folder).st_mode) == 0o700
    finally:
        rendezvous.close()


def test_a_folder_another_account_owns_is_no_place_for_the_rendezvous(tmp_path):
    from commhooks_lab.launcher.store import no_one_else_can_move

    theirs = tmp_path / "theirs"
    (theirs / "below").mkdir(parents=True)
    assert no_one_else_can_move(str(theirs / "below"))
    if os.geteuid() == 0 and not _unmapped(NOBODY):  # as root: nobody owns it, as if nobody had made it
        os.chown(theirs, NOBODY, NOBODY)
        assert not no_one_else_can_move(str(theirs / "below"))


@pytest.mark.skipif(why_unavailable() is not None, reason="needs user namespaces (unshare -r)")
def test_in_a_user_namespace_the_walk_up_ends_at_the_folder_checked_outside_it(tmp_path):
    """The challenge's sandbox child sees root's folders as an unmapped owner, as it sees another account's: its
    parent checks the way up outside and names the folder (found as a learner: every sandboxed entry refused)."""
    from commhooks_lab.launcher.store import CHECKED_ABOVE_VARIABLE

    if os.geteuid() != 0 or _unmapped(NOBODY):
        pytest.skip("needs root, to give a folder to nobody")
    theirs = tmp_path / "theirs"
    (theirs / "below").mkdir(parents=True)
    os.chown(theirs, NOBODY, NOBODY)
    code = "import sys; from commhooks_lab.launcher.store import no_one_else_can_move as m; print(m(sys.argv[1]))"

    def asks(checked: Path | None, *prefix: str) -> str:
        env = {k: v for k, v in os.environ.items() if k != CHECKED_ABOVE_VARIABLE}
        env |= {CHECKED_ABOVE_VARIABLE: str(checked)} if checked else {}
        command = [*prefix, sys.executable, "-c", code, str(theirs / "below")]
        return subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout.strip()

    assert asks(None, "unshare", "-r") == "False", "nobody's folder above: another account could move it"
    assert asks(theirs / "below", "unshare", "-r") == "True", "the walk ends at the folder checked outside"
    assert asks(theirs, "unshare", "-r") == "False", "the folder named is still checked itself"
    assert asks(theirs / "below") == "False", "outside a user namespace owners can be read: the variable is ignored"


def test_the_doctors_rendezvous_check_opens_no_store_socket(monkeypatch):
    """doctor used to open a TCPStore on every interface; its check now meets in a private FileStore."""
    import torch.distributed as dist

    from commhooks_lab import doctor

    def no_tcp_store(*args, **kwargs):
        raise AssertionError("the doctor opened a TCPStore")

    monkeypatch.setattr(dist, "TCPStore", no_tcp_store)
    result = doctor.check_rendezvous()
    assert result.status == doctor.PASS and "700 folder" in result.seen


def test_run_from_a_second_thread_waits_its_turn():
    """Two threads on one warm Cluster: the runs take turns instead of interleaving on the pipes."""
    import threading

    with Cluster(world_size=2) as cluster:
        results, errors = {}, []

        def work(name: str, hook: str) -> None:
            try:
                results[name] = lab.run(hook=hook, steps=6, cluster=cluster)
            except Exception as exc:  # pragma: no cover - the failure is the assertion below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(f"t{i}", h)) for i, h in enumerate(["fp16", "allreduce"] * 2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        alone = lab.run(hook="fp16", steps=6, cluster=cluster)
    assert not errors, errors
    assert results["t0"].final["param_digests"] == results["t2"].final["param_digests"] == alone.final["param_digests"]
    assert cluster.starts == 1


def _as_account(uid: int, max_fds: int | None = None):
    def drop() -> None:
        if max_fds is not None:  # the common soft limit of a login session (this container's is higher)
            resource.setrlimit(resource.RLIMIT_NOFILE, (max_fds, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)

    return drop


def _link_tree(source: Path, target: Path, owner: int) -> None:
    """``target`` mirrors ``source`` in hard links (no bytes copied; each file keeps its owner and mode), its
    folders ``owner``'s. A file other accounts may not read, or one on another filesystem, is copied to ``owner``."""
    for folder, _, files in os.walk(source):  # with __pycache__: recompiling torch's modules took the learner 60 s
        here = target / Path(folder).relative_to(source)
        here.mkdir(parents=True)
        os.chown(here, owner, owner)  # whatever this umask made it, the owner may enter it
        for name in files:
            src, dst = Path(folder) / name, here / name
            try:
                if not os.stat(src).st_mode & stat.S_IROTH:
                    raise PermissionError(src)
                os.link(src, dst)
            except OSError:  # EXDEV, EPERM (fs.protected_hardlinks) or a file private to its owner
                shutil.copy2(src, dst, follow_symlinks=True)
                os.chown(dst, owner, owner)


def _readable_by(uid: int, paths: list[Path]) -> bool:
    """Whether the account ``uid`` may read every one of ``paths`` (asked as that account: root may read anything)."""
    code = "import os, sys; sys.exit(not all(os.access(p, os.R_OK) for p in sys.argv[1:]))"
    probe = [SYSTEM_PYTHON, "-c", code, *map(str, paths)]
    return subprocess.run(probe, preexec_fn=_as_account(uid), env={"PATH": "/usr/bin:/bin"}, cwd="/").returncode == 0


@pytest.fixture(scope="module")
def learners_packages():
    """A PYTHONPATH the learner account can read: this checkout's package and this venv's packages. Where the
    clone or its venv lies in a folder no other account can enter (``/root``, a 0700 home), and the learner got
    ``Permission denied``, both are linked into a folder the learner owns (61,000 files here: 5-7 s to make, 10-27 s
    to remove on this busy 2-core machine)."""
    import torch

    package, purelib = ROOT / "commhooks_lab", Path(sysconfig.get_paths()["purelib"])
    if _readable_by(LEARNER, [package / "__init__.py", Path(torch.__file__)]):
        yield f"{ROOT}:{purelib}"
        return
    view = Path(tempfile.mkdtemp(prefix="commhooks-learner-packages-"))  # 0700, in a temp folder all may enter
    os.chown(view, LEARNER, LEARNER)
    _link_tree(package, view / "src" / "commhooks_lab", LEARNER)
    _link_tree(purelib, view / "site-packages", LEARNER)
    yield f"{view / 'src'}:{view / 'site-packages'}"
    shutil.rmtree(view, ignore_errors=True)


@pytest.fixture
def two_accounts(request):
    """``start(who, *argv)``: the learner (uid 4242, this venv's packages on the system Python) or the attacker
    (nobody), each a script of ``accounts/`` here, given as ``-c`` source: neither account may be able to read
    this checkout."""
    _play_accounts(LEARNER, NOBODY)
    found = subprocess.run([SYSTEM_PYTHON, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True)
    if found.returncode or found.stdout.decode().strip() != str(tuple(sys.version_info[:2])):
        pytest.skip(f"the learner account needs {SYSTEM_PYTHON} at Python {sys.version_info[:2]} (this venv's)")
    learners_packages = request.getfixturevalue("learners_packages")
    home = tempfile.mkdtemp(prefix="commhooks-learner-")
    os.chown(home, LEARNER, LEARNER)
    started: list[subprocess.Popen] = []

    def start(who: str, *argv: str) -> subprocess.Popen:
        if who == "learner":
            script, account = "learner.py", _as_account(LEARNER, max_fds=1024)
            env = {
                "HOME": home,
                "TMPDIR": home,
                "PATH": "/usr/bin:/bin",
                "PYTHONPATH": learners_packages,
                "COMMHOOKS_LAB_PREWARM": "0",
                # COMMHOOKS_LAB_PRIVATE_NETWORK=0 in the test's environment shows the attacks on the loopback
                **{k: v for k, v in os.environ.items() if k == "COMMHOOKS_LAB_PRIVATE_NETWORK"},
            }
        else:
            script, account, env = "gloo_attacker.py", _as_account(NOBODY), {"PATH": "/usr/bin:/bin"}
        proc = subprocess.Popen(
            [SYSTEM_PYTHON, "-c", (ACCOUNTS / script).read_text(), *argv],
            preexec_fn=account,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd="/",
        )
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
    shutil.rmtree(home, ignore_errors=True)


def _report(proc: subprocess.Popen, timeout_s: float = 240) -> dict:
    out, err = proc.communicate(timeout=timeout_s)
    lines = out.strip().splitlines()
    assert proc.returncode == 0 and lines, f"exit {proc.returncode}; stdout {out[-2000:]!r}; stderr {err[-3000:]}"
    return json.loads(lines[-1])


def _same_run_every_time(runs: list[dict]) -> None:
    errors = [run["error"] for run in runs if "error" in run]
    assert not errors, f"runs failed under attack: {errors}"
    assert len({run["digest"] for run in runs}) == 1, "a run under attack gave other numbers"
    assert max(run["seconds"] for run in runs) < 30, [round(run["seconds"], 1) for run in runs]


def test_another_account_cannot_hijack_the_ranks_gloo_pairs(two_accounts):
    """H1: the attacker watches /proc/net/tcp for the learner's new loopback listeners and sends gloo's pair
    handshake on each before the real peer can. On the machine's loopback it took 3 of 4 fresh Clusters (their
    first run timed out, 192 bytes of the ranks' traffic went to the attacker); in the private network it finds
    no listener at all."""
    attacker = two_accounts("attacker", "hijack", str(LEARNER), "200")
    learner = two_accounts("learner", "hijack")
    runs = _report(learner)
    attacker.stdin.write("done\n")
    attacker.stdin.flush()
    seen = _report(attacker, timeout_s=30)
    print(f"\nlearner: {runs}\nattacker: {seen}")  # the figures of the attack (-s shows them)
    assert runs["uid"] == LEARNER and seen["uid"] == NOBODY
    assert seen["listeners"] == 0, f"another account found {seen['listeners']} of the ranks' listeners: {seen}"
    _same_run_every_time(runs["runs"])


def test_another_account_cannot_fill_a_ranks_file_descriptors(two_accounts):
    """H2: while the learner's ranks start, the attacker connects 1,100 times to each of their listeners, sends 8
    bytes and closes; gloo keeps every unmatched socket, so on the loopback a rank at the common 1,024-fd limit
    aborts. In the private network the ranks' fds stay at their usual count and the warm Cluster lives on."""
    attacker = two_accounts("attacker", "flood", str(LEARNER), "120")
    learner = two_accounts("learner", "flood")
    ready = learner.stdout.readline().strip()
    attacker.stdin.write("done\n")
    attacker.stdin.flush()
    seen = _report(attacker, timeout_s=60)
    assert ready == "ready", f"the ranks did not start under the attack: {seen}; " + learner.stderr.read()[-3000:]
    learner.stdin.write("go\n")
    learner.stdin.flush()
    runs = _report(learner)
    print(f"\nlearner: {runs}\nattacker: {seen}")
    assert seen["uid"] == NOBODY and runs["private"], "the ranks do not have a network namespace of their own"
    assert seen["listeners"] == 0, f"another account found {seen['listeners']} of the ranks' listeners: {seen}"
    _same_run_every_time(runs["runs"])
    assert runs["starts"] == 1 and runs["fds_after"] is not None, "a rank died under the attack"
    assert max(runs["fds_before"] + runs["fds_after"]) <= 64, (runs["fds_before"], runs["fds_after"])


def test_a_rendezvous_folder_whose_owner_was_killed_goes_at_the_next_rendezvous(tmp_path, monkeypatch):
    """nbval and JupyterLab end kernels with SIGKILL, which no atexit survives: the suite left 40 folders a run in
    the temp folder. The next rendezvous removes those whose owner is gone, and only those."""
    from commhooks_lab.launcher import store

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    dead_owner = store._identity(child.pid)
    child.kill()
    child.wait()
    folders = {
        name: tmp_path / f"{store.PREFIX}{name}" for name in ("killed", "alive", "reused", "new", "old", "opening")
    }
    for folder in folders.values():
        folder.mkdir(mode=0o700)
    (folders["killed"] / store.OWNER).write_text(dead_owner)
    (folders["alive"] / store.OWNER).write_text(store._identity(os.getpid()))
    (folders["reused"] / store.OWNER).write_text(f"{os.getpid()} 12.000")  # this pid, another start time
    (folders["opening"] / store.OWNER).write_text("")  # as a CI run's sweep found one: opened, not yet written
    old = time.time() - store.UNOWNED_AGE_S - 60
    os.utime(folders["old"], (old, old))
    (tmp_path / "someone-elses-folder").mkdir()

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    rendezvous = store.PrivateRendezvous()
    try:
        left = {p.name for p in tmp_path.iterdir()} - {Path(rendezvous.folder).name}
        assert left == {folders["alive"].name, folders["new"].name, folders["opening"].name, "someone-elses-folder"}
        assert (Path(rendezvous.folder) / store.OWNER).read_text() == store._identity(os.getpid())
    finally:
        rendezvous.close()
