"""Which step each rank has reached, from the heartbeats ranks send, and who the others wait for.

A rank that never joins a collective leaves the others blocked in it, silently, until the
process group's timeout. Heartbeats (``ctx.heartbeat(step)``, one small message per step) let
the notebook say while it waits which rank is behind, and afterwards name the rank and the step.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["StepWatch"]


def _ranks(ranks) -> str:
    ranks = sorted(ranks)
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranks}"


@dataclass
class Verdict:
    """The rank(s) the others waited for, the step they waited at, and why."""

    ranks: list[int]
    step: int
    summary: str


class StepWatch:
    """Per rank: the last step it reported reaching, and when; which ranks have returned."""

    def __init__(self, world_size: int):
        self.world_size = world_size
        self.reached: dict[int, int] = {}
        self.since: dict[int, float] = {}  # when each rank reached its step
        self.returned: set[int] = set()
        self.longest_step_s = 0.0  # between two heartbeats of one rank
        self._warned_for: tuple | None = None
        self._warnings = 0

    @property
    def active(self) -> bool:
        """True once any rank has sent a heartbeat: only then can it tell who is behind."""
        return bool(self.reached)

    def beat(self, rank: int, step: int, now: float) -> None:
        if self.reached.get(rank) != step:
            if rank in self.since:
                self.longest_step_s = max(self.longest_step_s, now - self.since[rank])
            self.reached[rank] = step
            self.since[rank] = now

    def finished(self, rank: int) -> None:
        self.returned.add(rank)

    def _front(self) -> tuple[int, float]:
        """The furthest step any rank reached, and when the first rank got there."""
        front = max(self.reached.values())
        return front, min(t for r, t in self.since.items() if self.reached[r] == front)

    def behind(self) -> list[int]:
        """Ranks that have not reached the furthest step (a rank without heartbeats counts as behind)."""
        if not self.active:
            return []
        front, _ = self._front()
        return [r for r in range(self.world_size) if self.reached.get(r, -1) < front]

    def stall_message(self, now: float, every_s: float, timeout_s: float) -> str | None:
        """A line for the notebook each ``every_s`` seconds that the ranks make no progress."""
        if not self.active or len(self.returned) == self.world_size:
            return None
        front, first = self._front()
        behind = self.behind()
        key = (front, tuple(behind))
        if key != self._warned_for:
            self._warned_for, self._warnings = key, 0
        started = first if behind else max(self.since.values())
        waited = now - started
        if waited < every_s * (self._warnings + 1):
            return None
        self._warnings = int(waited // every_s)
        ahead = [r for r in range(self.world_size) if r not in behind]
        limit = f"(the run gives up after timeout_s={timeout_s:g} s without progress)"
        if behind:
            returned = sorted(set(behind) & self.returned)
            also = f"; {_ranks(returned)} already returned" if returned else ""
            return (
                f"commhooks_lab: {_ranks(behind)} has not reached step {front} for {waited:.0f} s "
                f"({_ranks(ahead)} did, and waits{also}) {limit}"
            )
        return f"commhooks_lab: no rank has gone past step {front} for {waited:.0f} s {limit}"

    def verdict(self, silent: list[int], timeout_s: float, timed_out: frozenset = frozenset()) -> Verdict | None:
        """After a hang: the rank(s) the others waited for, or None if the heartbeats cannot tell.

        ``timed_out``: the ranks that gave up waiting in a collective themselves (gloo's timeout).
        """
        if not self.active:
            return None
        front, _ = self._front()
        behind = self.behind()
        ahead_ranks = [r for r in range(self.world_size) if r not in behind]
        ahead = _ranks(ahead_ranks)
        waited = f"waited for it in a collective until timeout_s={timeout_s:g} s ran out"
        if behind and set(behind) <= timed_out and not silent:
            # The ranks behind were waiting in a collective too: the ones ahead got there by leaving one out.
            where = min(self.reached.get(r, 0) for r in behind)
            return Verdict(
                ahead_ranks,
                where,
                f"ran ahead to step {front} while {_ranks(behind)} waited in a collective of step {where}: it left "
                "out a collective the others joined (a hook or loop that skips one on some ranks), so every later "
                f"collective paired up wrongly until timeout_s={timeout_s:g} s ran out",
            )
        if not behind and not timed_out and len(silent) == self.world_size:
            return Verdict(
                [0],
                front,
                f"stopped in step {front}, as did every rank, with no collective timing out: they wait on something "
                "outside torch.distributed, such as a hook's Future that is never completed",
            )
        if behind:
            culprit = behind[0]
            last = self.reached.get(culprit)
            if culprit in self.returned:
                how = f"returned after step {last}"
            elif last is None:
                how = "sent no heartbeat at all"
            else:
                how = f"last reported step {last}"
            return Verdict(behind, front, f"never reached step {front}: it {how}, while {ahead} {waited}")
        if silent and len(silent) < self.world_size:
            others = _ranks(r for r in range(self.world_size) if r not in silent)
            return Verdict(
                sorted(silent),
                front,
                f"stopped answering in step {front} and never joined the collective that {others} "
                f"waited in until timeout_s={timeout_s:g} s ran out",
            )
        early = sorted(self.returned)
        if early and len(early) < self.world_size:
            others = _ranks(r for r in range(self.world_size) if r not in early)
            return Verdict(
                early,
                front,
                f"returned after step {front} while {others} still waited for it in a collective "
                f"(timeout_s={timeout_s:g} s): it never joined that collective",
            )
        return None
