"""Another account on the same machine can neither touch a learner's ranks nor make them allocate, hang or die.

A workshop server has many learners, each an unprivileged account. The test plays the other account for real: a
child that drops to ``nobody`` (CI runs as root) and, with only the standard library, does what such an account
can: list the rendezvous folder and open its store, connect to every socket the kernel and the ranks listen on
(``/proc/net/tcp`` shows them to anyone), send junk and a header announcing gigabytes, and hold half-open
connections while the learner runs again and starts new ranks. The learner's runs must still pass, give the same
numbers, and nothing may grow.
"""

import os
import subprocess
import textwrap
import time

import psutil
import pytest

import commhooks_lab as lab
from commhooks_lab import Cluster

pytestmark = pytest.mark.usefixtures("no_leftover_processes")

NOBODY = 65534
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


@pytest.fixture
def other_account():
    if os.geteuid() != 0:
        if os.environ.get("CI"):
            pytest.fail("CI runs as root so that this test can play another account", pytrace=False)
        pytest.skip("needs root to start a process as another account (nobody)")
    if not os.path.exists(SYSTEM_PYTHON):
        pytest.skip(f"the attacker needs a Python of its own at {SYSTEM_PYTHON}")
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
        assert ports and seen["connections held"] == 4 * len(ports), "the attacker reached every listener"
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
