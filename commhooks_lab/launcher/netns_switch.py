"""The ranks' private network: a switch in a user and network namespace, one rate-limited link per rank.

No root is needed. A rank server that hosts the network enters a new user namespace (its one user, this
account, is root there) and a new network namespace, and makes a bridge, the switch. Every rank it forks
then unshares a network namespace of its own, makes a veth pair whose far end goes into the switch, and,
for a limited link, puts tc's ``htb`` on both ends (what it sends, what it receives). gloo then talks over
``eth0``, the rank's only way out: no other account can enter these namespaces, so nothing of them is
reachable from outside, and everything goes when its processes do (the kernel removes a namespace, and the
veths in it, when its last process exits).

With nodes (:mod:`.topology`), the switch is the top switch. Each node is a network namespace of its own holding
the node's switch and one end of its uplink, whose other end is on the top switch: the first rank of a node to
arrive makes it (:func:`join_node`). A node's namespace has no process in it; its ranks hold it open, so it goes,
with its uplink, when the last of them exits.

``ip`` and ``tc`` (iproute2) do the work: they are what a learner would type, and what the notes quote.
pyroute2 (netlink from Python) could replace them; it is not needed where iproute2 is installed, as on
every Debian and Ubuntu. Added latency needs ``netem``, which some kernels lack (this kind of machine's
does): :func:`facts` says which, and a run's notes say when a delay asked for was not added.

Stdlib only, no relative imports at module level: ``python netns_switch.py`` is the availability
probe (run in a child, because entering a user namespace needs a process with one thread).
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
from typing import Any

__all__ = [
    "BRIDGE",
    "facts",
    "HOST_VARIABLE",
    "IFACE",
    "join",
    "join_node",
    "NetworkError",
    "NetworkUnavailableError",
    "qdisc_bytes",
    "why_unavailable",
]

CLONE_NEWUSER, CLONE_NEWNET = 0x10000000, 0x40000000
#: The switch, in the host's namespace; each rank's end of it is ``lab<pid>``.
BRIDGE = "labswitch"
#: The rank's one network card, in its own namespace.
IFACE = "eth0"
#: Set in the environment of a rank server that hosts the network (read by :mod:`.netns_preload`).
HOST_VARIABLE = "COMMHOOKS_LAB_NETWORK_HOST"
#: What a run can do where no link can be built: said after the cause and the way out.
WITHOUT_A_LINK = "without link=, the ranks run on this machine's loopback, where bytes cost almost nothing"


class NetworkUnavailableError(RuntimeError):
    """This machine cannot give the ranks a private network (the message names the cause and the way out)."""


class NetworkError(RuntimeError):
    """An ``ip`` or ``tc`` command of the private network failed."""


def _libc() -> Any:
    return ctypes.CDLL(None, use_errno=True)


def _call(name: str, *args: int) -> None:
    if getattr(_libc(), name)(*args) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{name}: {os.strerror(code)}")


def _tool(name: str) -> str:
    """Where ``ip`` or ``tc`` is: Debian installs iproute2 in /usr/sbin and /sbin, which an ordinary account's
    PATH leaves out (only root's has them), so they are looked for there too."""
    path = os.pathsep.join([os.environ.get("PATH", os.defpath), "/usr/sbin", "/sbin"])
    return shutil.which(name, path=path) or name


def _run(tool: str, commands: list[str]) -> None:
    """Run ``ip -batch -`` or ``tc -batch -`` on ``commands``; one error names the command that failed."""
    try:
        done = subprocess.run(
            [_tool(tool), "-batch", "-"], input="\n".join(commands) + "\n", capture_output=True, text=True
        )
    except FileNotFoundError as exc:
        raise NetworkError(f"{tool} is not installed: install iproute2 (apt-get install iproute2)") from exc
    if done.returncode:
        raise NetworkError(f"{tool} failed on {commands}: {done.stderr.strip() or done.stdout.strip()}")


def enter_user_and_network_namespace() -> None:
    """Become root of a new user namespace (this account mapped to root) with a network namespace of its own.

    Must be called while the process has one thread. Files it makes still belong to this account outside.
    """
    uid, gid = os.getuid(), os.getgid()
    _call("unshare", CLONE_NEWUSER | CLONE_NEWNET)
    for name, text in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"), ("gid_map", f"0 {gid} 1")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)


def host() -> None:
    """The rank server's part: the namespaces, the loopback and the switch."""
    enter_user_and_network_namespace()
    _run("ip", ["link set lo up", f"link add {BRIDGE} type bridge", f"link set {BRIDGE} up"])


def address(pid: int) -> str:
    """A rank's address on the switch, from its PID (unique on the machine, below 2**22): 10.x.y.z/8."""
    return f"10.{(pid >> 16) & 255}.{(pid >> 8) & 255}.{pid & 255}/8"


#: ``u32`` matches for TCP's pure ACKs, one per TCP header length: IPv4 without options, TCP, only ACK among the
#: flags URG ACK PSH RST SYN FIN (0x3f; ECN's bits may be set), and no payload (the IP total length is 20 bytes plus
#: the TCP header's, 4 x its data offset, 5 to 15 words): 40 bytes bare, 52 with timestamps, up to 80 with SACK
#: blocks. Not "any small TCP packet": gloo's small messages (its headers and ready-to-receive notes, a message's
#: last few bytes) are data, and sent ahead of the same connection's queued data they arrive out of order: the
#: receiver's duplicate ACKs and SACKs make the sender resend what was not lost. Not a length cut either (the
#: wondershaper recipe's < 64 bytes): the ACKs that carry SACK blocks, the ones a sender needs soonest, are longer.
PURE_ACKS = [
    f"match u8 0x45 0xff at 0 match ip protocol 6 0xff match u16 {20 + 4 * words:#06x} 0xffff at 2 "
    f"match u8 {words << 4:#04x} 0xf0 at 32 match u8 0x10 0x3f at 33"
    for words in range(5, 16)
]


def _shaping(dev: str, link: Any, delay: bool) -> list[str]:
    """tc commands for one end: htb at the link's rate, TCP's pure ACKs first, and netem's delay where asked (none
    for no link, as inside a node without intra_link=).

    Two htb classes share the rate: TCP's pure ACKs (1:10, served first) and everything else (1:20). With one
    FIFO, the ACKs for what a rank receives wait behind up to a second of what it sends (veth's 1000-packet
    queue at 10 Mbit/s), and TCP then moved 74-93 % of the rate, changing from run to run; with them first,
    100 % (measured: a 4 MB all-reduce of 2 ranks at 10 Mbit/s). A Linux host's own default queue
    (fq_codel) keeps ACKs from waiting in the same way; this kernel of the lab's machine has no fq_codel.
    Only pure ACKs (:data:`PURE_ACKS`): when the first class took every TCP packet under 128 bytes, gloo's
    header-only notes overtook their connection's queued data, and a flat all-reduce of 4 ranks on 2 nodes
    resent 14-25 % of its segments at 10 Mbit/s (6-8 % at 100 Mbit/s) and took 1.6-2.4x as long; now under 0.1 %.
    """
    commands: list[str] = []
    leaves = ["root"]
    if link is None:
        return commands
    if link.rate_bits is not None:
        rate, bits = link.tc_rate(), link.rate_bits
        commands += [
            f"qdisc add dev {dev} root handle 1: htb default 20",
            f"class add dev {dev} parent 1: classid 1:1 htb rate {rate} ceil {rate}",
            f"class add dev {dev} parent 1:1 classid 1:10 htb rate {bits / 20e3:.0f}kbit ceil {rate} prio 0",
            f"class add dev {dev} parent 1:1 classid 1:20 htb rate {bits * 19 / 20e3:.0f}kbit ceil {rate} prio 1",
        ]
        commands += [f"filter add dev {dev} parent 1: protocol ip prio 1 u32 {ack} flowid 1:10" for ack in PURE_ACKS]
        leaves = ["parent 1:10 handle 10:", "parent 1:20 handle 20:"]
    if delay and link.delay_ms:
        commands += [
            f"qdisc add dev {dev} {leaf} netem delay {link.delay_ms * 1000:.0f}us limit 100000" for leaf in leaves
        ]
    return commands


def _own_link(far_ns: int, switch: str, link: Any) -> str:
    """The rank's own namespace and veth, whose far end goes onto ``switch`` in the namespace ``far_ns`` (an fd),
    with ``link``'s shaping on both ends (None: none). Returns the interface gloo must use."""
    pid = os.getpid()
    far = f"lab{pid}"
    own_ns = -1
    try:
        _call("unshare", CLONE_NEWNET)
        own_ns = os.open("/proc/self/ns/net", os.O_RDONLY)
        _run(
            "ip",
            [
                f"link add name {IFACE} type veth peer name {far} netns /proc/{pid}/fd/{far_ns}",
                f"addr add {address(pid)} dev {IFACE}",
                "link set dev lo up",
                f"link set dev {IFACE} up",
            ],
        )
        delay = link is not None and bool(link.delay_ms) and facts()["netem"]
        own = _shaping(IFACE, link, delay)
        if own:
            _run("tc", own)
        _call("setns", far_ns, CLONE_NEWNET)
        try:
            _run("ip", [f"link set dev {far} master {switch}", f"link set dev {far} up"])
            far_shaping = _shaping(far, link, delay=False)
            if far_shaping:
                _run("tc", far_shaping)
        finally:
            _call("setns", own_ns, CLONE_NEWNET)
    finally:
        if own_ns >= 0:
            os.close(own_ns)
    return IFACE


def join(link: Any) -> str:
    """A rank's part, called first thing in a rank forked by the host: its own namespace and its link.

    Returns the interface gloo must use. The far end of the veth goes into the host's namespace, onto the
    switch, and gets the same rate, so the limit holds for what the rank receives too. A delay goes on
    the rank's own end only: one way between two ranks is then the delay asked for.
    """
    host_ns = os.open("/proc/self/ns/net", os.O_RDONLY)
    # a rank killed before :func:`leave` leaves its switch end to the kernel's background clean-up
    subprocess.run([_tool("ip"), "link", "del", f"lab{os.getpid()}"], capture_output=True)
    try:
        return _own_link(host_ns, BRIDGE, link)
    finally:
        os.close(host_ns)


#: A node's switch, and its end of the uplink, in the node's namespace.
NODE_SWITCH, UPLINK = "nodeswitch", "uplink"
#: The ranks' namespaces and fds held for the rank's life: a node's namespace lasts while one of its ranks does.
_held: list[int] = []


def _node_namespace(topology: Any, node: int, folder: str, host_ns: int) -> int:
    """An fd of ``node``'s namespace; the first rank of the node to come makes it, with its switch and uplink.

    ``folder``: the Cluster's private rendezvous folder, where a lock lets one rank per node make it, and a file
    says where the others find it (``/proc/<pid>/fd/<fd>`` of the rank that made it, alive while they start).
    """
    where = os.path.join(folder, f"node{node}.netns")
    with open(where + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.exists(where):
            with open(where) as f:
                return os.open(f.read().strip(), os.O_RDONLY)
        pid = os.getpid()
        # unique on the top switch while this Cluster's ranks live (a restart gets a new folder)
        top = f"up{hashlib.sha1(folder.encode()).hexdigest()[:8]}n{node}"
        _call("unshare", CLONE_NEWNET)
        node_ns = os.open("/proc/self/ns/net", os.O_RDONLY)
        try:
            _run(
                "ip",
                [
                    f"link add name {NODE_SWITCH} type bridge",
                    f"link set dev {NODE_SWITCH} up",
                    f"link add name {UPLINK} type veth peer name {top} netns /proc/{pid}/fd/{host_ns}",
                    f"link set dev {UPLINK} master {NODE_SWITCH}",
                    f"link set dev {UPLINK} up",
                ],
            )
            delay = bool(topology.uplink.delay_ms) and facts()["netem"]
            _run("tc", _shaping(UPLINK, topology.uplink, delay))  # what the node sends
            _call("setns", host_ns, CLONE_NEWNET)
            _run("ip", [f"link set dev {top} master {BRIDGE}", f"link set dev {top} up"])
            _run("tc", _shaping(top, topology.uplink, delay=False))  # what it receives
        except BaseException:
            os.close(node_ns)
            raise
        with open(where + ".new", "w") as f:
            f.write(f"/proc/{pid}/fd/{node_ns}")
        os.replace(where + ".new", where)
        return node_ns


def join_node(topology: Any, rank: int, folder: str) -> str:
    """A rank's part on a network of nodes, called first thing in a rank forked by the host: like :func:`join`,
    but the veth's far end goes onto its node's switch (made here if this rank is the node's first), at the
    topology's rate inside a node (none by default). Returns the interface gloo must use."""
    host_ns = os.open("/proc/self/ns/net", os.O_RDONLY)
    try:
        node_ns = _node_namespace(topology, topology.node_of(rank), folder, host_ns)
        _held.append(node_ns)  # open until this rank exits: the node's namespace lasts while its ranks do
        return _own_link(node_ns, NODE_SWITCH, topology.intra)
    finally:
        os.close(host_ns)


def leave() -> None:
    """A rank's last act on a clean exit: delete its veth, which takes the switch's end with it at once.

    The kernel would remove both when the rank's namespace goes, but in the background and, on a busy
    machine, seconds later: a rank forked meanwhile with the same pid would find its switch-side name taken.
    """
    subprocess.run([_tool("ip"), "link", "del", IFACE], capture_output=True)


def qdisc_bytes(dev: str = IFACE) -> int:
    """Bytes the root qdisc of ``dev`` has sent (Ethernet frames with their headers: what htb counts)."""
    done = subprocess.run(
        [_tool("tc"), "-s", "-j", "qdisc", "show", "dev", dev], capture_output=True, text=True, check=True
    )
    return int(next(q for q in json.loads(done.stdout) if q.get("root"))["bytes"])


# -- is it possible here? ------------------------------------------------------------------------------------


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _refusal(exc: OSError) -> dict:
    """Why this machine refuses a user namespace (``refused``), and what its owner can do about it (``way_out``)."""
    if _read("/proc/sys/kernel/apparmor_restrict_unprivileged_userns") == "1":
        return {
            "refused": "AppArmor forbids unprivileged user namespaces here "
            "(kernel.apparmor_restrict_unprivileged_userns=1, Ubuntu's default since 24.04)",
            "way_out": "`sudo sysctl -w kernel.apparmor_restrict_unprivileged_userns=0` allows them until the next "
            "boot (a line in /etc/sysctl.d/ keeps it)",
        }
    if _read("/proc/sys/kernel/unprivileged_userns_clone") == "0":
        return {
            "refused": "unprivileged user namespaces are off here (kernel.unprivileged_userns_clone=0)",
            "way_out": "`sudo sysctl -w kernel.unprivileged_userns_clone=1` allows them",
        }
    if _read("/proc/sys/user/max_user_namespaces") == "0" or exc.errno == errno.ENOSPC:
        return {
            "refused": "this machine allows no more user namespaces (user.max_user_namespaces is 0 or used up)",
            "way_out": "the machine's owner can allow them: `sudo sysctl -w user.max_user_namespaces=10000` (on a "
            "container's host: a container cannot raise it)",
        }
    return {
        "refused": f"this process may not create a user namespace ({exc}), as in a container whose seccomp "
        "profile forbids it",
        "way_out": "Docker: `docker run --security-opt seccomp=unconfined` (its default profile allows unshare and "
        "setns only with CAP_SYS_ADMIN); on a hosted notebook service there is none",
    }


class _ProbeLink:
    rate_bits, delay_ms = 100e6, 0.0

    def tc_rate(self) -> str:
        return "100mbit"


def _probe() -> dict:
    """In a fresh child: enter the namespaces, make a switch, a veth and an htb class, try netem."""
    try:
        enter_user_and_network_namespace()
    except OSError as exc:
        return _refusal(exc)
    try:
        _run("ip", ["link set lo up", "link add probe0 type veth peer name probe1", f"link add {BRIDGE} type bridge"])
        _run("tc", _shaping("probe0", _ProbeLink(), delay=False))
    except NetworkError as exc:
        return {"refused": str(exc), "way_out": "install iproute2, and a kernel with veth, bridge and htb"}
    try:
        _run("tc", ["qdisc add dev probe1 root netem delay 1ms"])
        netem = True
    except NetworkError:
        netem = False
    return {"refused": None, "netem": netem}


@functools.lru_cache(maxsize=1)
def facts() -> dict:
    """What this machine allows, found once per process by a child that tries it: ``refused`` (why not, or
    None), ``way_out`` (what the machine's owner can do about it) and ``netem`` (whether a delay can be added)."""
    if not sys.platform.startswith("linux"):
        return {"refused": f"{sys.platform} has no Linux network namespaces", "way_out": "none (Linux only)",
                "netem": False}  # fmt: skip
    try:
        done = subprocess.run(
            [sys.executable, "-I", "-S", os.path.abspath(__file__)], capture_output=True, text=True, timeout=30
        )
        found = json.loads(done.stdout)
    except (OSError, ValueError, subprocess.TimeoutExpired) as exc:
        return {"refused": f"the private network's probe failed ({exc})", "way_out": "report it", "netem": False}
    return {"netem": False, "way_out": "", **found}


def why_unavailable() -> str | None:
    """Why ranks cannot sit behind a link on this machine, and the way out; or None."""
    found = facts()
    return None if found["refused"] is None else f"{found['refused']}. Way out: {found['way_out']}"


if __name__ == "__main__":
    print(json.dumps(_probe()))
