"""Whether a Cluster's ranks get a private network of their own, where no other account can reach them.

gloo's ranks listen on TCP ports for each other. On the machine's own loopback every local account can connect
to them: one that sends gloo's 8-byte pair handshake first takes a rank's place in its pair (the run times out),
and one that connects a thousand times fills a rank's file descriptors (gloo keeps every unmatched socket), so it
aborts. Ranks forked by a rank server that hosts the lab's private network (:mod:`.netns_switch`) share that
server's own network namespace instead: its loopback is theirs alone, and no other account can enter it.

Stdlib only (the package decides this before torch loads, when it starts its rank server).
"""

from __future__ import annotations

import os

from . import netns_switch, notes

__all__ = ["isolates", "shared_loopback_note", "VARIABLE", "why_not_isolated"]

#: ``auto`` (unset): a private network wherever this machine allows one; ``1``: insist (refuse to start
#: without one); ``0``: the ranks share this machine's loopback with every local account.
VARIABLE = "COMMHOOKS_LAB_PRIVATE_NETWORK"
_ON, _OFF, _AUTO = ("1", "on", "yes", "true"), ("0", "off", "no", "false"), ("auto", "")


def wanted() -> str:
    """``auto``, ``on`` or ``off``, from :data:`VARIABLE`; any other value is refused with the ones it takes."""
    raw = os.environ.get(VARIABLE, "auto")
    value = raw.strip().lower()
    for name, spellings in (("on", _ON), ("off", _OFF), ("auto", _AUTO)):
        if value in spellings:
            return name
    raise ValueError(f"{VARIABLE}={raw!r}: use auto (the default), 1 (insist) or 0 (share this machine's loopback)")


def why_not_isolated(backend: str, start_method: str) -> str | None:
    """Why ranks of this backend and start method would share the machine's loopback, or None if they do not."""
    if wanted() == "off":
        return f"{VARIABLE}={os.environ[VARIABLE]!r} asks for this machine's loopback"
    if start_method != "forkserver":
        return f"start_method={start_method!r} starts the ranks outside the lab's rank server and its network"
    if backend != "gloo":
        return f"backend={backend!r}: only gloo's ranks are put in the private network (it is tested on CPU only)"
    return netns_switch.why_unavailable()


def shared_loopback_note() -> str:
    """What a machine that refuses the private network means for a learner, why, and the way out: one paragraph."""
    facts = netns_switch.facts()
    return (
        "the ranks talk over this machine's loopback, where any account on it can reach them (harmless on a "
        "machine only you use), and no rate-limited link can be built: `lab.studies.links` shows runs recorded on "
        f"a machine that could. Why: {facts['refused']}. Way out: {facts['way_out']}. "
        f"(`python -m commhooks_lab doctor` says more; {VARIABLE}=0 silences this.)"
    )


def isolates(backend: str, start_method: str) -> bool:
    """Should this Cluster's ranks get the private network? When they cannot, refuses under ``1``; under ``auto``
    says once per process (a note in a kernel, a warning elsewhere) if the machine refused it; a start method,
    backend or ``0`` chosen by hand is the user's call."""
    why = why_not_isolated(backend, start_method)
    if why is None:
        return True
    if wanted() == "on":
        raise netns_switch.NetworkUnavailableError(f"{VARIABLE}=1, but the ranks get no private network: {why}")
    if why == netns_switch.why_unavailable():  # the machine's refusal, not a choice
        notes.say_once("user_namespaces", shared_loopback_note(), stacklevel=3)
    return False
