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

__all__ = ["LiveFigures", "close_widgets"]

#: The notebooks' colours, in their order.
COLORS: list[str] = [to_hex(c) for c in rcParams["axes.prop_cycle"].by_key()["color"]]
_EMPTY = np.zeros(0)
_SIZE = {"height": "330px", "width": "100%"}


def _figure(title: str, x_scale, y_scale, x_label: str, y_label: str, marks: list) -> bq.Figure:
    """One figure, its words kept off the data: no legend or point labels inside it (each figure that needs one
    has an HTML legend below, see :func:`legend_html`), no toolbar over the title, room for the y label."""
    axes = [
        bq.Axis(scale=x_scale, label=x_label, tick_format=".0e" if isinstance(x_scale, bq.LogScale) else None),
        bq.Axis(scale=y_scale, label=y_label, side="left", tick_format=".0e", label_offset="58px"),
    ]
    return bq.Figure(
        marks=marks,
        axes=axes,
        title=title,
        title_style={"font-size": "14px"},
        fig_margin={"top": 40, "bottom": 50, "left": 85, "right": 30},
        layout=w.Layout(**_SIZE),
        animation_duration=0,
        display_toolbar=False,
    )


def legend_html(entries: list[tuple[str, str]]) -> str:
    """A legend under a figure: a coloured mark and the name, per entry; it wraps, and covers nothing."""
    items = [
        f'<span style="white-space:nowrap;margin-right:14px"><span style="color:{color}">&#9632;</span> '
        f"{html.escape(name)}</span>"
        for name, color in entries
    ]
    return f'<div class="hooklab-legend" style="font-size:12px;line-height:1.6">{" ".join(items)}</div>'


def fit_log_axis(scale: bq.LogScale, axis: bq.Axis, values, most: int = 7) -> None:
    """A log axis that spans whole decades around ``values``: at least two labelled ticks, and no point on an edge
    (bqplot fits the domain to the data, which left one tick and half a point at each end)."""
    values = np.asarray(values, dtype=float)
    values = values[np.isfinite(values) & (values > 0)]
    if not len(values):
        return
    low, high = np.floor(np.log10(values.min() / 1.5)), np.ceil(np.log10(values.max() * 1.5))
    scale.min, scale.max = float(10.0**low), float(10.0**high)
    axis.tick_values = decades(np.asarray([scale.min, scale.max]), most)


def decades(values: np.ndarray, most: int = 7) -> np.ndarray:
    """Tick values for a log axis: powers of ten spanning ``values``, every other one (or more) if there are many."""
    values = values[np.isfinite(values) & (values > 0)]
    if not len(values):
        return np.asarray([1.0])
    low, high = int(np.floor(np.log10(values.min()))), int(np.ceil(np.log10(values.max())))
    stride = max(1, -(-(high - low + 1) // most))
    return 10.0 ** np.arange(high, low - 1, -stride)[::-1]


def symmetric_ticks(lim: float) -> np.ndarray:
    """Five round ticks inside +-``lim``, the outer ones at most 0.8 lim, so that the two axes' end labels
    keep clear of each other in the corner they share."""
    step = 10.0 ** np.floor(np.log10(lim))
    nice = next((m * step for m in (5, 4, 3, 2, 1, 0.5) if m * step <= 0.8 * lim), 0.5 * step)
    return np.asarray([-nice, -nice / 2, 0.0, nice / 2, nice])


def _widgets_in(value: Any) -> list[w.Widget]:
    if isinstance(value, w.Widget):
        return [value]
    if isinstance(value, list | tuple):
        return [x for item in value for x in _widgets_in(item)]
    if isinstance(value, dict):  # a mark's scales
        return [x for item in value.values() for x in _widgets_in(item)]
    return []


def close_widgets(*roots: w.Widget) -> None:
    """Close ``roots`` and every widget they hold, however deep: a box's children, a figure's marks, axes and
    scales, and each one's layout and style, which ipywidgets makes as widgets of their own. Closing only the
    boxes' children left 85 of a dashboard's 118 widgets open in the kernel."""
    seen: set[int] = set()
    todo = list(roots)
    while todo:
        widget = todo.pop()
        if id(widget) in seen:
            continue
        seen.add(id(widget))
        for name in widget.keys:  # the synced traits: where a widget refers to others
            todo.extend(_widgets_in(getattr(widget, name)))
        widget.close()


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
            "Error per step: lower is closer to exact",
            step,
            log_error,
            "step",
            "rel_error (log)",
            list(self.error_lines),
        )
        self.error_legend = w.HTML("")
        payload, mean_error = bq.LogScale(), bq.LogScale()
        self.points = bq.Scatter(
            x=_EMPTY, y=_EMPTY, scales={"x": payload, "y": mean_error}, names=[], display_names=False, default_size=90
        )
        self.tradeoff = _figure(
            "Bytes saved vs error paid in one step",
            payload,
            mean_error,
            "payload / fp32 all-reduce payload (log)",
            "mean rel_error per step (log)",
            [self.points],
        )
        self.tradeoff_legend = w.HTML("")
        spread_step, spread = bq.LinearScale(), bq.LogScale()
        self.spread_line = bq.Lines(x=_EMPTY, y=_EMPTY, scales={"x": spread_step, "y": spread}, marker="circle")
        self.spread = _figure(
            "Do all ranks agree?", spread_step, spread, "step", "rank_spread, max |h_r - h_0|", [self.spread_line]
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
        for axis in self.agreement_figure.axes:
            axis.tick_format = ".1e"
        #: The upper row's one-line reading (plots.takeaway), as text above it: a figure title would be cut.
        self.takeaway = w.HTML("")
        half = {"width": "50%"}
        self.overview = w.VBox(
            [
                self.takeaway,
                w.HBox(
                    [
                        w.VBox([self.error, self.error_legend], layout=w.Layout(**half)),
                        w.VBox([self.tradeoff, self.tradeoff_legend], layout=w.Layout(**half)),
                    ]
                ),
            ]
        )
        self.agreement = w.HBox(
            [w.VBox([self.spread], layout=w.Layout(**half)), w.VBox([self.agreement_figure], layout=w.Layout(**half))]
        )
        self._live: dict[str, list[float]] = {"step": [], "rel_error": [], "rank_spread": []}

    def close(self) -> None:
        """Close every widget the figures made (their marks, scales, axes, layouts and styles)."""
        close_widgets(self.overview, self.agreement)

    # -- while a run trains --------------------------------------------------------------------------
    def start_run(self, name: str, earlier: list[Result]) -> None:
        """Run number ``len(earlier)`` starts: the last line is its, empty; the latest earlier runs beside it."""
        index = len(earlier)
        beside = earlier[len(earlier) - (self.max_runs - 1) :] if self.max_runs > 1 else []
        self._draw_error_lines(beside, index - len(beside))
        line = self.error_lines[-1]
        with line.hold_sync():
            line.x, line.y, line.labels, line.colors = _EMPTY, _EMPTY, [f"{name} (running)"], [color_of(index)]
        self._show_error_legend(beside, index - len(beside), running=(name, color_of(index)))
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
        error_axis, spread_axis = self.error.axes[1], self.spread.axes[1]
        fit_log_axis(error_axis.scale, error_axis, np.concatenate([line.y for line in self.error_lines]))
        fit_log_axis(spread_axis.scale, spread_axis, np.asarray(self.spread_line.y))

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
        which = f"The last {len(recent)} runs (plotted): " if len(recent) < len(results) else ""
        self.takeaway.value = f"<b>{html.escape(which + takeaway(recent))}</b>"
        points, _, _ = tradeoff_points(recent)
        index = {id(r): offset + i for i, r in enumerate(recent)}
        with self.points.hold_sync():
            self.points.x = np.asarray([p.x for p in points])
            self.points.y = np.asarray([p.y for p in points])
            # numbered as in the runs table: bqplot keys a scatter's points by name, and two runs of one hook
            # shared a name, which gave a point another run's colour
            self.points.names = [f"{index[id(p.result)] + 1}. {p.label}" for p in points]
            self.points.colors = [color_of(index[id(p.result)]) for p in points]
        x_axis, y_axis = self.tradeoff.axes
        fit_log_axis(x_axis.scale, x_axis, self.points.x)
        fit_log_axis(y_axis.scale, y_axis, self.points.y)
        self.tradeoff_legend.value = legend_html(
            [
                (f"{name}: {p.x:.1%} of the bytes, error {p.y:.2g}", color_of(index[id(p.result)]))
                for name, p in zip(self.points.names, points)
            ]
        )
        self._show_agreement(results[-1], len(results) - 1)
        self._log_ticks()

    def _draw_error_lines(self, runs: list[Result], first_index: int) -> None:
        """``runs`` on the first lines (run ``first_index`` first), every other line emptied."""
        lines = self.error_lines[: len(runs)]
        for i, (line, r) in enumerate(zip(lines, runs)):
            with line.hold_sync():
                line.x = np.asarray(r.steps["step"], dtype=float)
                line.y = np.maximum(np.asarray(r.steps["rel_error"], dtype=float), FLOOR)
                line.labels, line.colors = [r.name], [color_of(first_index + i)]
        for line in self.error_lines[len(runs) :]:
            with line.hold_sync():
                line.x, line.y, line.labels = _EMPTY, _EMPTY, []
        self._show_error_legend(runs, first_index)

    def _show_error_legend(self, runs: list[Result], first_index: int, running: tuple[str, str] | None = None) -> None:
        entries = [(f"{first_index + i + 1}. {r.name}", color_of(first_index + i)) for i, r in enumerate(runs)]
        if running:
            entries.append((f"{first_index + len(runs) + 1}. {running[0]} (running)", running[1]))
        self.error_legend.value = legend_html(entries)

    def _show_agreement(self, result: Result, index: int) -> None:
        s = result.steps
        spread = np.asarray(s["rank_spread"], dtype=float)
        agree = bool(spread.max() == 0)
        self.spread.title = (  # a spread of 0 is drawn on the floor of the log axis, not left out
            f"{result.name}: all ranks agree (0, on the floor)" if agree else f"{result.name}: ranks differ (0 = agree)"
        )
        with self.spread_line.hold_sync():
            self.spread_line.x = np.asarray(s["step"], dtype=float)
            self.spread_line.y = np.maximum(spread, FLOOR)
            self.spread_line.colors, self.spread_line.visible = [color_of(index)], True
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
        for axis in self.agreement_figure.axes:  # nine "-4.0e-2" labels ran into each other, and into the corner
            axis.scale.min, axis.scale.max = -1.05 * lim, 1.05 * lim
            axis.tick_values = symmetric_ticks(lim)
        self.agreement_figure.title = f"{result.name}, {sample['layer']}: on the line, h = exact"
