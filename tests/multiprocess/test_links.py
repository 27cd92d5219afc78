"""Ranks behind a real rate-limited link: the spec, the refusals, the rate itself, the same numbers, nothing left.

The tests that build a link need user and network namespaces; where the machine refuses them they skip with
the cause the lab gives a learner (on this kind of machine they run).
"""

import errno
import json
import os
import subprocess
import sys
import time

import pytest
from conftest import live_children, wait_gone

import commhooks_lab as lab
from commhooks_lab.launcher import Cluster, netns_switch, rank_server, session
from commhooks_lab.launcher.link_spec import Link, as_link, payload_share
from commhooks_lab.launcher.netns_switch import NetworkUnavailableError

pytestmark = pytest.mark.usefixtures("no_leftover_processes")
WHY_NOT = netns_switch.why_unavailable()
needs_links = pytest.mark.skipif(WHY_NOT is not None, reason=f"no private network here: {WHY_NOT}")

# -- the spec ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "rate", "delay"),
    [("100mbit", 100e6, 0.0), ("1Gbit", 1e9, 0.0), ("2.5gbit", 2.5e9, 0.0), ("unlimited", None, 0.0),
     ("10mbit delay 5ms", 10e6, 5.0), ("1gbit delay 250us", 1e9, 0.25)],
)  # fmt: skip
def test_a_link_reads_as_tc_reads_a_rate(spec, rate, delay):
    link = as_link(spec)
    assert (link.rate_bits, link.delay_ms) == (rate, delay)
    assert as_link(link.spec) == link  # what a result records reads back the same


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("100mbps", "bytes per second to tc"),  # tc's mbps is 8 Mbit/s
        ("0", "not a rate"),
        ("-1gbit", "cannot be negative"),
        ("fast", "not a rate"),
        ("100mb", "unknown unit 'mb'"),
        ("10kbit", "between 100kbit and 100gbit"),
        ("", "empty"),
        ("100mbit delay", "optionally followed by 'delay 5ms'"),
        ("100mbit delay 0ms", "more than 0"),
        (100, "a bare number does not say bits or bytes"),
    ],
)
def test_a_bad_link_is_refused_with_what_to_write(spec, says):
    with pytest.raises((ValueError, TypeError), match=says):
        as_link(spec)


def test_the_payload_share_is_tcps_segment_over_the_frame():
    assert payload_share() == 1448 / 1514  # MTU 1500, TCP timestamps: Linux's defaults


# -- refusals, before any process starts --------------------------------------------------------------------------


def test_where_the_machine_refuses_namespaces_nothing_starts_and_the_cause_is_named(monkeypatch):
    cause = "AppArmor forbids unprivileged user namespaces here (...): sudo sysctl ..., or run without link="
    monkeypatch.setattr(netns_switch, "why_unavailable", lambda: cause)
    before = live_children()
    with pytest.raises(NetworkUnavailableError, match=r"link='100mbit' cannot be built on this machine: AppArmor") as e:
        Cluster(2, link="100mbit")
    assert str(e.value).endswith(netns_switch.WITHOUT_A_LINK)
    with pytest.raises(NetworkUnavailableError, match="AppArmor"):
        lab.run(hook="fp16", steps=2, link="100mbit", fresh=True)
    with pytest.raises(NetworkUnavailableError, match="AppArmor"):
        session.get_cluster(2, link="1gbit")
    assert live_children() == before


@pytest.mark.parametrize(
    ("files", "code", "says", "way_out"),
    [
        ({"/proc/sys/kernel/apparmor_restrict_unprivileged_userns": "1"}, errno.EACCES,
         "apparmor_restrict_unprivileged_userns=1", "sudo sysctl -w kernel.apparmor_restrict_unprivileged_userns=0"),
        ({"/proc/sys/kernel/unprivileged_userns_clone": "0"}, errno.EPERM, "unprivileged_userns_clone=0",
         "sudo sysctl -w kernel.unprivileged_userns_clone=1"),
        ({"/proc/sys/user/max_user_namespaces": "0"}, errno.EPERM, "max_user_namespaces",
         "a container cannot raise it"),
        ({}, errno.ENOSPC, "no more user namespaces", "a container cannot raise it"),  # used up, or 0 in a parent
        ({}, errno.EPERM, "seccomp", "--security-opt seccomp=unconfined"),
    ],
)  # fmt: skip
def test_each_cause_of_a_refused_namespace_names_a_way_out_that_exists(monkeypatch, files, code, says, way_out):
    """No "raise it" where a container cannot, and no model promised to stand in that no cell shows."""
    monkeypatch.setattr(netns_switch, "_read", files.get)
    found = netns_switch._refusal(OSError(code, os.strerror(code)))
    assert says in found["refused"] and way_out in found["way_out"]
    assert "raise it," not in found["way_out"] and "stands in" not in found["way_out"]


def test_a_link_needs_the_rank_server_and_gloo_and_ranks_the_lab_starts():
    with pytest.raises(ValueError, match="needs start_method='forkserver'"):
        Cluster(2, link="100mbit", start_method="spawn")
    with pytest.raises(ValueError, match="under torchrun or accelerate launch"):
        lab.ExperimentConfig(link="1gbit").check(local=False)


def test_timing_refuses_the_probes_measurement_and_other_apis():
    with pytest.raises(ValueError, match="pass measure=False with timing=True"):
        lab.ExperimentConfig(timing=True).check()
    with pytest.raises(ValueError, match="timing=True runs with api='torch'"):
        lab.ExperimentConfig(timing=True, measure=False, api="fsdp2", hook="fp16").check()


# -- the link is real ------------------------------------------------------------------------------------------------


def _qdisc_rate(ctx, floats: int) -> dict:
    """One all-reduce of ``floats`` float32s: its time, and what this rank's link sent per second."""
    import torch
    import torch.distributed as dist

    x = torch.ones(floats)
    dist.all_reduce(x)  # the first one sets up gloo's pairs
    dist.barrier()
    sent = netns_switch.qdisc_bytes()
    start = time.perf_counter()
    dist.all_reduce(x)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "bits_per_s": 8 * (netns_switch.qdisc_bytes() - sent) / seconds}


def _fan_in(ctx, floats: int) -> float:
    """Every rank but 0 sends ``floats`` float32s to rank 0 at once; the seconds rank 0 waited for them all."""
    import torch
    import torch.distributed as dist

    dist.barrier()
    start = time.perf_counter()
    if ctx.rank == 0:
        for work in [dist.irecv(torch.empty(floats), src) for src in range(1, ctx.world_size)]:
            work.wait()
    else:
        dist.send(torch.ones(floats), 0)
    dist.barrier()
    return time.perf_counter() - start


@needs_links
def test_each_rank_sends_and_receives_at_the_set_rate():
    """The wire rate holds on every rank (at 100 Mbit/s the bench measures it within 2 %); what a rank *receives* is
    limited too: two ranks sending to the third at once share its one link."""
    rate = 100e6
    with Cluster(3, link="100mbit") as cluster:
        rows = cluster.run(_qdisc_rate, 1_250_000)  # 5 MB
        for row in rows:
            assert 0.6 * rate < row["bits_per_s"] <= 1.05 * rate, rows
        floats = 250_000  # 1 MB from each of two ranks
        waited = cluster.run(_fan_in, floats)[0]
    one_link_s = 2 * 4 * floats * 8 / (rate * payload_share())
    assert waited >= 0.9 * one_link_s, f"2 MB reached rank 0 in {waited:.2f} s; its link allows {one_link_s:.2f} s"


#: In a fresh user + network namespace: one veth end with a link's htb, and TCP packets of known shapes sent out of
#: it through a raw socket (a fixed neighbour, so no ARP); prints, per shape, the packets each htb class sent.
_CLASSIFY = r"""
import json, re, socket, struct, subprocess, sys, time
sys.path.insert(0, sys.argv[1])
import netns_switch as ns

ns.enter_user_and_network_namespace()
ns._run("ip", ["link add probe0 type veth peer name probe1", "link set probe0 up", "link set probe1 up",
               "addr add 10.0.0.1/24 dev probe0", "neigh add 10.0.0.2 lladdr 02:00:00:00:00:02 dev probe0"])
ns._run("tc", ns._shaping("probe0", ns._ProbeLink(), delay=False))

def sent():
    out = subprocess.run([ns._tool("tc"), "-s", "class", "show", "dev", "probe0"], capture_output=True, text=True)
    return {c: int(n) for c, n in re.findall(r"class htb (\S+) .*\n Sent \d+ bytes (\d+) pkt", out.stdout)}

def packet(flags, words, payload):
    tcp = struct.pack("!HHIIBBHHH", 40000, 50000, 1, 1, words << 4, flags, 65535, 0, 0) + b"\1" * (4 * words - 20)
    body = tcp + b"x" * payload
    ends = socket.inet_aton("10.0.0.1"), socket.inet_aton("10.0.0.2")
    return struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(body), 0, 0, 64, 6, 0, *ends) + body

raw = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
found = {}
for name, shape in json.loads(sys.argv[2]).items():
    before = sent()
    for _ in range(5):
        raw.sendto(packet(*shape), ("10.0.0.2", 0))
    time.sleep(0.02)
    after = sent()
    found[name] = after["1:10"] - before["1:10"]
print(json.dumps(found))
"""


@needs_links
def test_only_tcps_pure_acks_go_first_not_small_data():
    """A small data segment sent ahead of its connection's queued data arrives out of order, and the receiver's
    SACKs make the sender resend what was not lost (a flat 4-rank ring at 10 Mbit/s resent 14-25 % of its
    segments while the first class took every TCP packet under 128 bytes). So the first class (1:10) takes pure
    ACKs of every header length, SACK blocks included, and nothing that carries data or a FIN."""
    ack, psh, fin = 0x10, 0x08, 0x01
    first = {  # (TCP flags, header words, payload bytes): goes first?
        (ack, 5, 0): True,  # a bare ACK, 40 bytes
        (ack, 8, 0): True,  # with timestamps, 52 bytes
        (ack, 15, 0): True,  # with SACK blocks, 80 bytes: longer than the wondershaper recipe's 64
        (0xC0 | ack, 8, 0): True,  # with ECN's ECE and CWR
        (ack | psh, 8, 16): False,  # gloo's small message, 68 bytes: under the old cut of 128
        (ack, 8, 1): False,  # one byte of data without PSH
        (ack | fin, 8, 0): False,  # a FIN is sequenced like data
        (ack | psh, 8, 1448): False,  # a full segment
    }
    shapes = {str(shape): shape for shape in first}
    launcher = os.path.dirname(netns_switch.__file__)
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", _CLASSIFY, launcher, json.dumps(shapes)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    went_first = json.loads(done.stdout)
    assert went_first == {str(shape): 5 if yes else 0 for shape, yes in first.items()}, went_first


@needs_links
def test_a_run_behind_a_link_gives_the_same_numbers_only_slower():
    hooks = ["allreduce", "fp16", "power_sgd[matrix_approximation_rank=1,start_powerSGD_iter=2]", "topk"]
    plain = lab.compare(hooks, steps=4, fresh=True)
    linked = lab.compare(hooks, steps=4, link="10mbit", fresh=True)
    for a, b in zip(plain, linked):
        assert b.config["link"] == "10mbit" and a.config["link"] is None
        assert a.final["param_digests"] == b.final["param_digests"]
        times = ["step_time_s"]
        assert a.steps.drop(columns=times).equals(b.steps.drop(columns=times)), a.name
        assert a.layers.equals(b.layers)
        assert any("limited to 10mbit each way" in n for n in b.notes)
    slow = linked.by_name("allreduce").step_ms()["median"] / plain.by_name("allreduce").step_ms()["median"]
    assert slow > 3, "an all-reduce of 40 kB behind 10 Mbit/s takes longer than on loopback"


def _interfaces(pid: int) -> set[str]:
    """The network interfaces of the namespace that process ``pid`` is in."""
    with open(f"/proc/{pid}/net/dev") as f:
        return {line.split(":")[0].strip() for line in f.readlines()[2:]}


def _namespace(pid: int) -> str:
    return os.readlink(f"/proc/{pid}/ns/net")


@needs_links
def test_nothing_is_left_behind_ranks_veths_or_namespaces():
    with Cluster(2, link="1gbit") as cluster:
        ranks = cluster.pids
        server = cluster._server.pid
        assert {f"lab{pid}" for pid in ranks} <= _interfaces(server)
        spaces = {_namespace(pid) for pid in [os.getpid(), server, *ranks]}
        assert len(spaces) == 4, "the notebook, the switch and each rank: a network namespace each"
        assert _interfaces(ranks[0]) == {"lo", "eth0"}
    assert not wait_gone(ranks)
    deadline = time.monotonic() + 10
    while any(f"lab{pid}" in _interfaces(server) for pid in ranks) and time.monotonic() < deadline:
        time.sleep(0.05)  # each rank deletes its veth pair as it leaves
    assert _interfaces(server) == {"lo", netns_switch.BRIDGE}
    host = rank_server._servers.pop(next(k for k, s in rank_server._servers.items() if s.pid == server))
    host.stop()
    assert not wait_gone([server])


# -- every way to run ------------------------------------------------------------------------------------------------


@needs_links
def test_the_dashboard_and_the_magics_run_behind_a_link(capsys):
    board = lab.HookLab(steps=3, fresh=True)
    try:
        board.link.value = "100mbit"
        assert "each rank behind a link of its own" in board.link_note.value
        board.run_button.click()
        assert board.error.value == "", board.error.value
        assert board.results[-1].config["link"] == "100mbit" and board.cluster.spec.link == Link(100e6)
        assert "step_ms" in board.table.value
    finally:
        board.close()
    from _ddp_magic import ddp_started

    with ddp_started("-n 2 --link 1gbit") as shell:
        assert "each behind a 1gbit link" in capsys.readouterr().out
        shell.run_cell_magic("ddp", "", "import os\nprint(os.environ['GLOO_SOCKET_IFNAME'], world_size)")
        assert "[ranks 0, 1]\neth0 2" in capsys.readouterr().out


@needs_links
def test_the_command_line_takes_a_link_and_prints_step_times():
    done = subprocess.run(
        [sys.executable, "-m", "commhooks_lab", "--hooks", "fp16", "--steps", "3", "--link", "100mbit", "--timing",
         "--out", "", "--quiet"],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "step_ms" in done.stdout and "limited to 100mbit each way" in done.stdout
    assert "timing: step_time_s is DDP's own" in done.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "commhooks_lab", "--link", "100mbps"], capture_output=True, text=True, timeout=120
    )
    assert bad.returncode == 2 and "bytes per second" in bad.stderr and "Traceback" not in bad.stderr


@needs_links
def test_timing_changes_only_how_the_hook_waits():
    measured = lab.run(hook="fp16", steps=4, link="1gbit", fresh=True)
    timed = lab.run(hook="fp16", steps=4, link="1gbit", timing=True, measure=False, fresh=True)
    assert measured.final["param_digests"] == timed.final["param_digests"]
    assert any("DDP's own" in n for n in timed.notes) and any("serialized" in n for n in measured.notes)
    chained = lab.run(hook="power_sgd[start_powerSGD_iter=2]", steps=3, timing=True, measure=False, fresh=True)
    assert any("waits for each bucket" in n for n in chained.notes)
