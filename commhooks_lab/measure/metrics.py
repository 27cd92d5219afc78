"""The probe's arithmetic: a share of the parameters measured in float64 against the exact mean.

Every rank measures its own contiguous share of the parameters (balanced by size), so the work
and the bytes it needs are split W ways; rank 0 then turns every share's sums into the metrics.
Per step and parameter a share keeps five float64 sums, from which every metric follows:

    d.d, e.e, h.h, max|d|, max_r max|h_r - h_0|      (d = h - e, e = exact, h = the hook's result)

    rel_error = sqrt(d.d / e.e),   cosine = (h.h + e.e - d.d) / (2 sqrt(h.h e.e))

Dot products of a vector with itself and min/max are the cheapest passes there are, and every
float64 vector lives in a reused buffer: no per-element temporaries, no mixed-dtype arithmetic
(many times slower on CPU than a float64 copy followed by float64 arithmetic).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .scratch import Scratch

__all__ = ["cumulative", "errors_from_sums", "metrics", "ShareMeter", "shares", "SUMS"]

SUMS = 5  # per parameter: d.d, e.e, h.h, max|d|, rank spread


@dataclass(frozen=True)
class _Share:
    """Parameters ``first..stop-1`` (in model order), elements ``start..end-1`` of the flat gradient."""

    first: int
    stop: int
    start: int
    end: int

    @property
    def numel(self) -> int:
        return self.end - self.start


def shares(sizes: list[int], world_size: int) -> list[_Share]:
    """Contiguous runs of parameters, one per rank, balanced by element count (a rank may get none)."""
    total, out, first, done = sum(sizes), [], 0, 0
    for q in range(world_size):
        target, stop, end = total * (q + 1) / world_size, first, done
        while stop < len(sizes) and (q == world_size - 1 or end + sizes[stop] / 2 <= target):
            end += sizes[stop]
            stop += 1
        out.append(_Share(first, stop, done, end))
        first, done = stop, end
    return out


class ShareMeter:
    """Measures one share, step after step, keeping the running sums the cumulative error needs."""

    def __init__(self, share: _Share, sizes: list[int], world_size: int, scratch: Scratch):
        self.share = share
        self.sizes = sizes[share.first : share.stop]
        self.offsets = [sum(self.sizes[:i]) for i in range(len(self.sizes))]
        self.world_size = world_size
        self.scratch = scratch
        self.last: tuple[torch.Tensor, torch.Tensor] | None = None  # (h, exact) of the last step measured
        self._started = False

    def _buffer(self, name: str, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        return self.scratch.named(name, (self.share.numel,), dtype)

    def measure(self, local: list[torch.Tensor], hooked: list[torch.Tensor], keep_last: bool) -> torch.Tensor:
        """Rank r's local gradient and hook result over this share -> [SUMS per parameter..., cum d.d, cum e.e]."""
        h = hooked[0]
        exact, diff = self._buffer("exact").copy_(local[0]), self._buffer("diff")
        for other in local[1:]:
            exact.add_(diff.copy_(other))  # in float64, in rank order
        exact.div_(self.world_size)
        diff.copy_(h)
        hh = [diff[o : o + s].dot(diff[o : o + s]) for o, s in zip(self.offsets, self.sizes)]
        diff.sub_(exact)
        sums: list[torch.Tensor] = []
        for offset, size, h_dot_h in zip(self.offsets, self.sizes, hh):
            if size == 0:
                sums.extend([diff.new_zeros(())] * SUMS)
                continue
            d, e = diff[offset : offset + size], exact[offset : offset + size]
            low, high = torch.aminmax(d)
            sums.extend([d.dot(d), e.dot(e), h_dot_h, torch.maximum(-low, high), self._spread(hooked, offset, size)])
        if not self._started:
            self._buffer("sum_diff").zero_()
            self._buffer("sum_exact").zero_()
            self._started = True
        sum_diff, sum_exact = self._buffer("sum_diff").add_(diff), self._buffer("sum_exact").add_(exact)
        sums.extend([sum_diff.dot(sum_diff), sum_exact.dot(sum_exact)])
        if keep_last:  # for sample(): swap buffers rather than copy
            self._buffer("last_exact")
            self.scratch.swap("exact", "last_exact")
            self.last = (self._buffer("last_h", h.dtype).copy_(h), exact)
        return torch.stack(sums)

    def state_dict(self) -> dict:
        if not self._started:
            return {"started": False}
        return {"started": True, "sum_diff": self._buffer("sum_diff"), "sum_exact": self._buffer("sum_exact")}

    def load_state_dict(self, saved: dict) -> None:
        self._started = saved["started"]
        if self._started:
            self._buffer("sum_diff").copy_(saved["sum_diff"])
            self._buffer("sum_exact").copy_(saved["sum_exact"])

    def _spread(self, hooked: list[torch.Tensor], offset: int, size: int) -> torch.Tensor:
        """max_r max |h_r - h_0| over one parameter, in float64; ranks that agree bit for bit cost one compare."""
        h0 = hooked[0][offset : offset + size]
        spread = h0.new_zeros((), dtype=torch.float64)
        for other in hooked[1:]:
            theirs = other[offset : offset + size]
            if torch.equal(theirs, h0):
                continue
            gap = self._buffer("gap")[:size].copy_(theirs)
            gap.sub_(self._buffer("gap_h0")[:size].copy_(h0))
            low, high = torch.aminmax(gap)
            spread = torch.maximum(spread, torch.maximum(-low, high))
        return spread


def metrics(names: list[str], sizes: list[int], sums: list[float]) -> tuple[dict, list[dict]]:
    """One step's metrics from every share's sums, in parameter order: (step metrics, layer rows)."""
    per_layer = [sums[SUMS * i : SUMS * i + SUMS] for i in range(len(sizes))]
    layers = [
        {
            "layer": name,
            "numel": size,
            **errors_from_sums(dd, ee, hh, mx),
            "rank_spread": spread,
            "exact_norm": math.sqrt(ee),
        }
        for name, size, (dd, ee, hh, mx, spread) in zip(names, sizes, per_layer)
    ]
    dd, ee, hh = (sum(v[j] for v in per_layer) for j in range(3))
    step = errors_from_sums(dd, ee, hh, _max(v[3] for v in per_layer))
    step["rank_spread"] = _max(v[4] for v in per_layer)
    return step, layers


def cumulative(sum_dd: float, sum_ee: float) -> float:
    """||sum_t (h_t - exact_t)|| / ||sum_t exact_t|| from its squared halves."""
    return _ratio(math.sqrt(sum_dd), math.sqrt(sum_ee))


def _max(values) -> float:
    """The largest value; NaN if any is NaN (as torch's max)."""
    values = list(values)
    return math.nan if any(math.isnan(v) for v in values) else max(values, default=0.0)


def _ratio(num: float, den: float) -> float:
    return num / den if den > 0 else (0.0 if num == 0 else math.inf)


def errors_from_sums(dd: float, ee: float, hh: float, max_abs: float) -> dict:
    """rel_error, cosine and max_abs_error from d.d, e.e and h.h: h.e = (h.h + e.e - d.d) / 2, accurate to a
    few units in the last place of the magnitudes."""
    denom = math.sqrt(hh) * math.sqrt(ee)
    return {
        "rel_error": _ratio(math.sqrt(dd), math.sqrt(ee)),
        "cosine": (hh + ee - dd) / 2 / denom if denom > 0 else math.nan,
        "max_abs_error": max_abs,
    }
