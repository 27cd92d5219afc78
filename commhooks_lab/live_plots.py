"""The dashboard's figures: bqplot marks whose data change in place, so a click costs its steps, not a redraw.

matplotlib redraws a whole figure in the kernel for every change (0.1-0.3 s a figure here, most of it text and
ticks); bqplot sends the new numbers to the browser, which draws them. So the curves can grow while the ranks
train (one step row per event, ``ExperimentConfig(live=True)``) and a click ends when the ranks end. The
marks are made once, with the dashboard; what a browser shows is their data, which a test reads in the kernel.
"""

from __future__ import annotations

import html
from typing import Any

import bqplot as bq
import ipywidgets as w
import numpy as np
from matplotlib import rcParams
from matplotlib.colors import to_hex

from .plots import FLOOR, takeaway, tradeoff_points
from .result import Result

__all__ = ["LiveFigures"]

#: The notebooks' colours, in their order.
COLORS: list[str] = [to_hex(c) for c in rcParams["axes.prop_cycle"].by_key()["color"]]
_EMPTY = np.zeros(0)
_SIZE = {"height": "330px", "width": "50%"}


def _figure(title: str, x_scale, y_scale, x_label: str, y_label: str, marks: list, legend: bool = False) -> bq.Figure:
    axes = [
        bq.Axis(scale=x_scale, label=x_label, tick_format=".0e" if isinstance(x_scale, bq.LogScale) else None),
        bq.Axis(scale=y_scale, label=y_label, side="left", tick_format=".0e", label_offset="55px"),
    ]
    return bq.Figure(
        marks=marks,
        axes=axes,
        title=title,
        title_style={"font-size": "14px"},
        legend_location="bottom-right" if legend else "top-left",
        legend_text={"font-size": "11px"},
        legend_style={"fill": "white", "fill-opacity": 0.7, "stroke-width": 0},
        fig_margin={"top": 40, "bottom": 50, "left": 75, "right": 20},
        layout=w.Layout(**_SIZE),
        animation_duration=0,
    )


def decades(values: np.ndarray, most: int = 7) -> np.ndarray:
    """Tick values for a log axis: powers of ten spanning ``values``, every other one (or more) if there are many."""
    values = values[np.isfinite(values) & (values > 0)]
    if not len(values):
        return np.asarray([1.0])
    low, high = int(np.floor(np.log10(values.min()))), int(np.ceil(np.log10(values.max())))
    stride = max(1, -(-(high - low + 1) // most))
    return 10.0 ** np.arange(high, low - 1, -stride)[::-1]


def color_of(index: int) -> str:
    """A run's colour: by its place in the session, so it keeps it on every click."""
    return COLORS[index % len(COLORS)]


class LiveFigures:
    """Two rows of two figures: error per step | bytes vs error; do ranks agree | the hook's gradient vs exact."""

    def __init__(self, max_runs: int):
        self.max_runs = max_runs
        step, log_error = bq.LinearScale(), bq.LogScale()
        #: One line per plotted run, the last one the run in progress; made once, their data replaced.
        self.error_lines = [
            bq.Lines(x=_EMPTY, y=_EMPTY, scales={"x": step, "y": log_error}, marker="circle", marker_size=12)
            for _ in range(max_runs)
        ]
        self.error = _figure(
            "Error per step", step, log_error, "step", "rel_error", list(self.error_lines), legend=True
        )
        payload, mean_error = bq.LogScale(), bq.LogScale()
        self.points = bq.Scatter(
            x=_EMPTY, y=_EMPTY, scales={"x": payload, "y": mean_error}, names=[], display_names=True, default_size=90
        )
        self.tradeoff = _figure(
            "Bytes saved vs error paid (lower left is better)",
            payload,
            mean_error,
            "payload / fp32 allreduce payload",
            "mean rel_error per step",
            [self.points],
        )
        spread_step, spread = bq.LinearScale(), bq.LogScale()
        self.spread_line = bq.Lines(x=_EMPTY, y=_EMPTY, scales={"x": spread_step, "y": spread}, marker="circle")
        self.spread = _figure(
            "Do all ranks agree?", spread_step, spread, "step", "rank_spread = max |h_r - h_0|", [self.spread_line]
        )
        exact, hook = bq.LinearScale(), bq.LinearScale()
        self.diagonal = bq.Lines(x=_EMPTY, y=_EMPTY, scales={"x": exact, "y": hook}, colors=["black"], stroke_width=1)
        self.sample = bq.Scatter(x=_EMPTY, y=_EMPTY, scales={"x": exact, "y": hook}, default_size=8, opacities=[0.5])
        self.agreement_figure = _figure(
            "The hook's gradient against the exact mean",
            exact,
            hook,
            "exact mean gradient",
            "hook's gradient h",
            [self.sample, self.diagonal],
        )
        self.agreement_figure.axes[1].tick_format = ".1e"
        self.agreement_figure.axes[0].tick_format = ".1e"
        #: The upper row's one-line reading (plots.takeaway), as text above it: a figure title would be cut.
        self.takeaway = w.HTML("")
        self.overview = w.VBox([self.takeaway, w.HBox([self.error, self.tradeoff])])
        self.agreement = w.HBox([self.spread, self.agreement_figure])
        self._live: dict[str, list[float]] = {"step": [], "rel_error": [], "rank_spread": []}

    # -- while a run trains --------------------------------------------------------------------------
    def start_run(self, name: str, earlier: list[Result]) -> None:
        """Run number ``len(earlier)`` starts: the last line is its, empty; the latest earlier runs beside it."""
        index = len(earlier)
        beside = earlier[len(earlier) - (self.max_runs - 1) :] if self.max_runs > 1 else []
        self._draw_error_lines(beside, index - len(beside))
        line = self.error_lines[-1]
        with line.hold_sync():
            line.x, line.y, line.labels, line.colors = _EMPTY, _EMPTY, [f"{name} (running)"], [color_of(index)]
            line.display_legend = True
        self._live = {"step": [], "rel_error": [], "rank_spread": []}
        self.spread.title = f"Do all ranks agree? {name}, running"
        with self.spread_line.hold_sync():
            self.spread_line.x, self.spread_line.y, self.spread_line.colors = _EMPTY, _EMPTY, [color_of(index)]
            self.spread_line.visible = True

    def add_rows(self, rows: list[dict]) -> None:
        """The run in progress measured these steps: its curves grow by them."""
        rows = [r for r in rows if "rel_error" in r]
        if not rows:
            return
        for key in self._live:
            self._live[key].extend(float(r[key]) for r in rows)
        steps = np.asarray(self._live["step"])
        line = self.error_lines[-1]
        with line.hold_sync():
            line.x, line.y = steps, np.maximum(self._live["rel_error"], FLOOR)
        with self.spread_line.hold_sync():
            self.spread_line.x, self.spread_line.y = steps, np.maximum(self._live["rank_spread"], FLOOR)
        self._log_ticks()

    def _log_ticks(self) -> None:
        """Decades on the log axes whose data just changed (bqplot's own log ticks crowd: 2e-1 3e-1 ...)."""
        self.error.axes[1].tick_values = decades(np.concatenate([line.y for line in self.error_lines]))
        self.spread.axes[1].tick_values = decades(np.asarray(self.spread_line.y))

    # -- when a run ends -------------------------------------------------------------------------------
    def show(self, results: list[Result]) -> None:
        """Every figure from the session's finished ``results`` (the last ``max_runs`` of them on the left); a run
        that failed part-way leaves no line behind."""
        if not results:
            self._draw_error_lines([], 0)
            self.spread_line.x, self.spread_line.y = _EMPTY, _EMPTY
            return
        recent = results[-self.max_runs :]
        offset = len(results) - len(recent)
        self._draw_error_lines(recent, offset)
        self.takeaway.value = f"<b>{html.escape(takeaway(recent))}</b>"
        points, _, _ = tradeoff_points(recent)
        index = {id(r): offset + i for i, r in enumerate(recent)}
        with self.points.hold_sync():
            self.points.x = np.asarray([p.x for p in points])
            self.points.y = np.asarray([p.y for p in points])
            self.points.names = [p.label for p in points]
            self.points.colors = [color_of(index[id(p.result)]) for p in points]
        x_axis, y_axis = self.tradeoff.axes
        x_axis.tick_values, y_axis.tick_values = decades(self.points.x), decades(self.points.y)
        self._show_agreement(results[-1], len(results) - 1)
        self._log_ticks()

    def _draw_error_lines(self, runs: list[Result], first_index: int) -> None:
        """``runs`` on the first lines (run ``first_index`` first), every other line emptied."""
        lines = self.error_lines[: len(runs)]
        for i, (line, r) in enumerate(zip(lines, runs)):
            with line.hold_sync():
                line.x = np.asarray(r.steps["step"], dtype=float)
                line.y = np.maximum(np.asarray(r.steps["rel_error"], dtype=float), FLOOR)
                line.labels, line.colors, line.display_legend = [r.name], [color_of(first_index + i)], True
        for line in self.error_lines[len(runs) :]:
            with line.hold_sync():
                line.x, line.y, line.labels, line.display_legend = _EMPTY, _EMPTY, [], False

    def _show_agreement(self, result: Result, index: int) -> None:
        s = result.steps
        spread = np.asarray(s["rank_spread"], dtype=float)
        agree = bool(spread.max() == 0)
        self.spread.title = (
            f"{result.name}: every rank holds the same gradient (rank_spread = 0 at every step)"
            if agree
            else f"{result.name}: do all ranks agree? (0 = DDP's invariant)"
        )
        with self.spread_line.hold_sync():
            self.spread_line.x = np.asarray(s["step"], dtype=float)
            self.spread_line.y = np.maximum(spread, FLOOR)
            self.spread_line.colors, self.spread_line.visible = [color_of(index)], not agree
        sample: Any = result.sample
        if not sample:
            self.sample.x, self.sample.y, self.diagonal.x, self.diagonal.y = _EMPTY, _EMPTY, _EMPTY, _EMPTY
            self.agreement_figure.title = f"{result.name}: no gradient sample (measure=False)"
            return
        exact, hook = np.asarray(sample["exact"], dtype=float), np.asarray(sample["hook"], dtype=float)
        lim = float(np.abs(np.concatenate([exact, hook])).max()) or 1.0
        with self.sample.hold_sync():
            self.sample.x, self.sample.y, self.sample.colors = exact, hook, [color_of(index)]
        self.diagonal.x, self.diagonal.y = np.asarray([-lim, lim]), np.asarray([-lim, lim])
        self.agreement_figure.title = (
            f"{result.name}: {sample['layer']} {tuple(sample['shape'])}, last step (h = exact on the line)"
        )
