"""A network link for the ranks, as a learner writes it: ``"100mbit"``, ``"1gbit"``, ``"10mbit delay 5ms"``.

Each rank the lab starts behind a link sits on a link of its own into a shared switch, like a node with one
network card: the rate holds in each direction (what the rank sends, and what it receives), so a ring all-reduce
takes ``2(W-1)/W x bytes / rate`` on every rank at once, the alpha-beta model's assumption
(:mod:`commhooks_lab.studies.network`). :mod:`.netns_switch` builds it; this module only reads and checks
the spec, in tc's own units (``kbit``, ``mbit``, ``gbit``: bits per second, powers of 1000).
Stdlib only: the rank server imports it before torch.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

__all__ = ["Link", "MTU", "as_link", "link_notes", "payload_share"]

#: Bits per second for each unit tc knows as bits (tc(8): "bit", "kbit", "mbit", "gbit", "tbit"; powers of 1000).
BIT_UNITS = {"bit": 1.0, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
#: tc reads these as *bytes* per second ("mbps" is 8 Mbit/s): the classic slip, refused with the fix.
BYTE_UNITS = {"bps": 1, "kbps": 1e3, "mbps": 1e6, "gbps": 1e9}
#: Below this a 1 MB gradient takes longer than a lesson's timeout; above it no laptop's loopback keeps up.
MIN_RATE_BITS, MAX_RATE_BITS = 100e3, 100e9
#: The longest one-way delay the lab adds (netem's, where the kernel has it).
MAX_DELAY_MS = 1000.0
#: The ranks' links carry Ethernet's usual frames (veth's default).
MTU = 1500
_RATE = re.compile(r"^(?P<number>[0-9]+(?:\.[0-9]+)?)(?P<unit>[a-z]+)$")
_DELAY = re.compile(r"^(?P<number>[0-9]+(?:\.[0-9]+)?)(?P<unit>ms|us)$")
EXAMPLES = "'100mbit', '1gbit', '2.5gbit', '10mbit delay 5ms' or 'unlimited'"


def payload_share(mtu: int = MTU) -> float:
    """The share of a link's rate left for TCP's payload: MSS / (Ethernet frame), 1448 / 1514 at MTU 1500.

    tc's htb counts each frame's Ethernet, IP and TCP headers (14 + 20 + 32 bytes with timestamps, Linux's
    default), so a rank that is sending at the full rate hands the peer ``payload_share()`` of it.
    """
    return (mtu - 20 - 32) / (mtu + 14)


@dataclass(frozen=True)
class Link:
    """One rank's link: ``rate_bits`` per second each way (None: no limit), plus ``delay_ms`` one way."""

    rate_bits: float | None
    delay_ms: float = 0.0

    @property
    def spec(self) -> str:
        """The link as ``as_link`` reads it (and as results record it)."""
        rate = "unlimited" if self.rate_bits is None else _format_rate(self.rate_bits)
        return rate + (f" delay {self.delay_ms:g}ms" if self.delay_ms else "")

    @property
    def rate_gbps(self) -> float:
        return math.inf if self.rate_bits is None else self.rate_bits / 1e9

    def tc_rate(self) -> str:
        """The rate as tc reads it (``100mbit``); only for a limited link."""
        assert self.rate_bits is not None
        return f"{self.rate_bits / 1e3:.0f}kbit"

    def describe(self) -> str:
        if self.rate_bits is None:
            how = "a link of its own without a rate limit (a veth pair into the lab's private switch)"
        else:
            how = (
                f"a link of its own limited to {_format_rate(self.rate_bits)} each way (tc htb on both ends of a "
                "veth pair into the lab's private switch)"
            )
        return f"every rank sat behind {how}"

    def __str__(self) -> str:
        return self.spec


def _format_rate(bits: float) -> str:
    for unit, scale in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3)):
        if bits >= scale and (bits / scale) == round(bits / scale, 3):
            return f"{bits / scale:g}{unit}"
    return f"{bits / 1e3:g}kbit"


def _rate(text: str, spec: object, name: str = "link") -> float | None:
    if text == "unlimited":
        return None
    match = _RATE.match(text)
    if match is None:
        sign = " (a rate cannot be negative)" if text.startswith("-") else ""
        raise ValueError(f"{name}={spec!r}: {text!r} is not a rate{sign}; write a number and a unit: {EXAMPLES}")
    number, unit = float(match["number"]), match["unit"]
    if unit in BYTE_UNITS:
        bits = number * BYTE_UNITS[unit] * 8
        raise ValueError(
            f"{name}={spec!r}: {unit!r} means bytes per second to tc ({number:g}{unit} = {_format_rate(bits)}); "
            f"the lab takes rates in bits per second, as network cards are sold: write {number:g}{unit[:-3]}bit "
            f"for {number:g} {unit[:-3].upper() or ''}bit/s, between {_format_rate(MIN_RATE_BITS)} and "
            f"{_format_rate(MAX_RATE_BITS)}"
        )
    if unit not in BIT_UNITS:
        raise ValueError(f"{name}={spec!r}: unknown unit {unit!r}; use bit, kbit, mbit or gbit (bits per second)")
    bits = number * BIT_UNITS[unit]
    if not MIN_RATE_BITS <= bits <= MAX_RATE_BITS:
        raise ValueError(
            f"{name}={spec!r}: the rate must be between {_format_rate(MIN_RATE_BITS)} and "
            f"{_format_rate(MAX_RATE_BITS)}, got {text}"
        )
    return bits


def _delay(text: str, spec: object, name: str = "link") -> float:
    match = _DELAY.match(text)
    if match is None:
        raise ValueError(f"{name}={spec!r}: {text!r} is not a delay; write e.g. '5ms' or '200us'")
    ms = float(match["number"]) / (1000.0 if match["unit"] == "us" else 1.0)
    if not 0 < ms <= MAX_DELAY_MS:
        raise ValueError(f"{name}={spec!r}: the delay must be more than 0 and at most {MAX_DELAY_MS:g} ms")
    return ms


def as_link(spec: object, name: str = "link") -> Link | None:
    """``None`` (the machine's own loopback), a :class:`Link`, or a spec string; anything else is refused."""
    if spec is None or isinstance(spec, Link):
        return spec
    if not isinstance(spec, str):
        raise TypeError(
            f"{name} must be a string with a unit ({EXAMPLES}) or None, got {type(spec).__name__} {spec!r}: "
            "a bare number does not say bits or bytes"
        )
    words = spec.strip().lower().split()
    if not words:
        raise ValueError(f"{name}={spec!r} is empty; write {EXAMPLES}, or {name}=None for no link")
    rate = _rate(words[0], spec, name)
    delay = 0.0
    if len(words) == 3 and words[1] == "delay":
        delay = _delay(words[2], spec, name)
    elif len(words) != 1:
        raise ValueError(f"{name}={spec!r}: write a rate, optionally followed by 'delay 5ms': {EXAMPLES}")
    return Link(rate, delay)


def link_notes(link: Link | None, topology: Any = None) -> list[str]:
    """What a result behind ``link`` should say about its network: the link (or the nodes, ``topology``: a
    :class:`~.topology.Topology`, whose uplink ``link`` is; not imported here, it imports this), and any latency
    not added. Nodes without a link (by name only) say that their times are loopback's."""
    if link is None:
        return [] if topology is None else [f"nodes: {topology.describe()}"]
    from .netns_switch import facts

    notes = [f"link: {link.describe() if topology is None else topology.describe()}"]
    if facts()["netem"]:
        if link.delay_ms:
            where = "each rank's link" if topology is None else "each node's uplink"
            notes.append(f"link: netem added {link.delay_ms:g} ms one way on {where}")
    elif link.delay_ms:
        notes.append(
            f"link: the delay of {link.delay_ms:g} ms asked for was NOT added: this kernel has no netem "
            '("Specified qdisc kind is unknown"); only the rate holds, and latency is the veth\'s own'
        )
    else:
        notes.append("link: no latency added (this kernel has no netem); latency is the veth's own")
    return notes
