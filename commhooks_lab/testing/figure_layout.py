"""Do a figure's words read at a glance? Text that collides, falls outside, hides data, or axes that say too little.

Matplotlib knows where every piece of text lands (``Text.get_window_extent``) once a figure is
drawn, so the checks are exact at the figure's own size and resolution:

- no two texts overlap (titles, labels, tick labels, legend entries, annotations);
- no text falls outside the figure (it would be cut off where the figure is shown at its size);
- no legend, and no note written inside the axes, covers a plotted point or line;
- every numeric axis that shows ticks shows at least two, and has a label (where the units go).

``check_on_show()`` makes ``plt.show()`` raise :class:`FigureLayoutError` with every problem, so
a notebook run under nbval fails on the cell that drew the figure (the test suite installs it in
every kernel it starts, through an IPython startup file: ``tests/conftest.py``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from itertools import combinations

__all__ = [
    "FigureLayoutError",
    "Problem",
    "check_figure",
    "check_on_show",
    "check_when_imported",
    "write_ipython_startup",
]

#: How far (pixels) two boxes may touch before it counts: glyph boxes carry a little padding.
SLACK_PX = 1.0
NUMBER = re.compile(r"^[\s\u2212+-]*(\d|\.\d|\$)")


class FigureLayoutError(AssertionError):
    """A figure whose text would not read at a glance."""


@dataclass(frozen=True)
class Problem:
    figure: str
    what: str

    def __str__(self) -> str:
        return f"{self.figure}: {self.what}"


def _name(fig) -> str:
    """A figure by its words: the suptitle, else its first axes' title."""
    if getattr(fig, "_suptitle", None) is not None and fig._suptitle.get_text():
        return repr(fig._suptitle.get_text()[:60])
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    return repr(titles[0][:60]) if titles else f"figure {fig.number if hasattr(fig, 'number') else '?'}"


def _shrunk(box, by: float = SLACK_PX):
    from matplotlib.transforms import Bbox

    return Bbox.from_extents(box.x0 + by, box.y0 + by, box.x1 - by, box.y1 - by)


def _drawn_tick_labels(axis) -> list:
    """The tick labels the last draw really put on the page (matplotlib keeps ticks outside the view too)."""
    ticks = axis._update_ticks()  # the ticks Axis.draw draws: inside the view interval
    return [label for tick in ticks for label in (tick.label1, tick.label2) if label.get_visible() and label.get_text()]


def _hidden_texts(fig) -> set:
    """Texts matplotlib keeps but does not draw: tick labels (drawn ones are added back), the labels of an
    axis turned off, a hidden legend's entries."""
    hidden: set = set()
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            for tick in axis.get_major_ticks() + axis.get_minor_ticks():
                hidden.update((tick.label1, tick.label2))
            if not (ax.axison and axis.get_visible()):
                hidden.update((axis.label, axis.get_offset_text()))
        legend = ax.get_legend()
        if legend is not None and not legend.get_visible():
            hidden.update([*legend.get_texts(), legend.get_title()])
    return hidden


def _texts(fig) -> list:
    """Every text the figure shows: titles, axis labels, drawn tick labels, legends, annotations, figure texts."""
    from matplotlib.text import Text

    hidden = _hidden_texts(fig)
    drawn = [
        t
        for t in fig.findobj(Text)
        if t not in hidden and t.get_visible() and t.get_text().strip() and (t.axes is None or t.axes.get_visible())
    ]
    for ax in fig.axes:
        if ax.get_visible() and ax.axison:
            drawn += [t for axis in (ax.xaxis, ax.yaxis) if axis.get_visible() for t in _drawn_tick_labels(axis)]
    return drawn


def _data_points(ax, renderer):
    """The display coordinates of what an axes plots: line vertices (and points between them) and scatter offsets."""
    import numpy as np

    points = []
    for line in ax.lines:
        if not line.get_visible():
            continue
        xy = line.get_transform().transform(np.column_stack(line.get_data()).astype(float))
        xy = xy[np.isfinite(xy).all(axis=1)]
        if len(xy) > 1:  # 8 points along each segment: a line through a legend hides under it between vertices
            steps = np.linspace(0, 1, 8)[:, None, None]
            xy = (xy[:-1][None] * (1 - steps) + xy[1:][None] * steps).reshape(-1, 2)
        points.append(xy)
    for collection in ax.collections:
        offsets = collection.get_offsets()
        if collection.get_visible() and len(offsets):
            points.append(collection.get_offset_transform().transform(np.asarray(offsets, dtype=float)))
    inside = ax.get_window_extent(renderer)
    xy = np.concatenate(points) if points else np.empty((0, 2))
    return xy[(xy[:, 0] >= inside.x0) & (xy[:, 0] <= inside.x1) & (xy[:, 1] >= inside.y0) & (xy[:, 1] <= inside.y1)]


def _inside(xy, box) -> int:
    return int(((xy[:, 0] > box.x0) & (xy[:, 0] < box.x1) & (xy[:, 1] > box.y0) & (xy[:, 1] < box.y1)).sum())


def _has_data(ax) -> bool:
    return bool(ax.lines or ax.collections or ax.patches or ax.images)


def check_figure(fig) -> list[Problem]:
    """Every reason this figure's text would not read at a glance (empty when it does)."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    name = _name(fig)
    page = fig.bbox
    problems: list[Problem] = []
    texts = [(t, t.get_window_extent(renderer)) for t in _texts(fig)]
    for text, box in texts:
        if (
            box.x0 < page.x0 - SLACK_PX
            or box.x1 > page.x1 + SLACK_PX
            or box.y0 < page.y0 - SLACK_PX
            or box.y1 > (page.y1 + SLACK_PX)
        ):
            problems.append(Problem(name, f"{text.get_text()!r} falls outside the figure (cut off)"))
    for (a, box_a), (b, box_b) in combinations(texts, 2):
        if _shrunk(box_a).overlaps(_shrunk(box_b)):
            problems.append(Problem(name, f"{a.get_text()!r} overlaps {b.get_text()!r}"))
    for ax in fig.axes:
        xy = _data_points(ax, renderer)
        legend = ax.get_legend()
        covering = (
            [(f"the legend of {ax.get_title()!r}", legend)] if legend is not None and legend.get_visible() else []
        )
        covering += [(f"the note {t.get_text()[:40]!r}", t) for t in ax.texts if t.get_visible() and t.get_text()]
        for what, artist in covering:
            covered = _inside(xy, _shrunk(artist.get_window_extent(renderer), 2 * SLACK_PX))
            if covered:
                problems.append(Problem(name, f"{what} covers {covered} plotted points"))
        if not (ax.get_visible() and ax.axison and _has_data(ax)):
            continue
        for axis, label in ((ax.xaxis, ax.get_xlabel()), (ax.yaxis, ax.get_ylabel())):
            shown = [t.get_text() for t in _drawn_tick_labels(axis)] if axis.get_visible() else []
            numeric = [t for t in shown if NUMBER.match(t)]
            if not numeric:
                continue  # no ticks, or categories named by their labels
            which = f"{axis.axis_name} axis of {ax.get_title()!r}"
            if len(set(numeric)) < 2:
                problems.append(Problem(name, f"the {which} has one tick ({numeric[0]}): give it at least two"))
            if not label.strip():
                problems.append(Problem(name, f"the {which} has no label (what is measured, in which unit)"))
    return problems


def check_on_show(report: str | None = None) -> None:
    """Make ``matplotlib.pyplot.show`` check every open figure first.

    Without ``report`` it raises :class:`FigureLayoutError` naming what does not read; with it, it
    appends one JSON line per figure to that file (its name and problems) and shows it anyway.
    """
    import json

    import matplotlib.pyplot as plt

    if getattr(plt.show, "_checks_layout", False):
        return
    shown = plt.show

    def show(*args, **kwargs):
        found = {number: check_figure(plt.figure(number)) for number in plt.get_fignums()}
        if report is not None:
            with open(report, "a") as f:
                for number, problems in found.items():
                    record = {"figure": _name(plt.figure(number)), "problems": [p.what for p in problems]}
                    f.write(json.dumps(record) + "\n")
        elif any(found.values()):
            plt.close("all")
            listed = "\n".join(f"- {p}" for problems in found.values() for p in problems)
            raise FigureLayoutError(f"this figure does not read at a glance:\n{listed}")
        return shown(*args, **kwargs)

    show._checks_layout = True  # type: ignore[attr-defined]
    plt.show = show


def check_when_imported(report: str | None = None) -> None:
    """:func:`check_on_show` as soon as ``matplotlib.pyplot`` is imported (at once if it is already): a kernel
    whose cells draw nothing never imports pyplot (half a second of CPU for each kernel the tests start)."""
    import sys

    if "matplotlib.pyplot" in sys.modules:
        check_on_show(report)
        return
    sys.meta_path.insert(0, _AfterImport("matplotlib.pyplot", lambda: check_on_show(report)))


class _AfterImport:
    """A meta path finder that finds ``name`` as the others do and calls ``then()`` right after it executed."""

    def __init__(self, name: str, then) -> None:
        self.name, self.then = name, then

    def find_spec(self, fullname, path, target=None):
        import sys

        if fullname != self.name:
            return None
        sys.meta_path.remove(self)  # once: the next import of it is the module already loaded
        for finder in sys.meta_path:
            spec = finder.find_spec(fullname, path, target) if hasattr(finder, "find_spec") else None
            if spec is not None:
                break
        else:
            return None
        loader, then = spec.loader, self.then
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        execute = loader.exec_module

        def exec_module(module) -> None:
            execute(module)
            then()

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


STARTUP = """# Written by commhooks_lab.testing.figure_layout: every plt.show() here checks its figures first.
# The module is loaded from its file, not through the package, so that starting a kernel imports no lab code.
import importlib.util as _util, os as _os, sys as _sys
_spec = _util.spec_from_file_location("commhooks_lab_figure_layout", {path!r})
_module = _sys.modules[_spec.name] = _util.module_from_spec(_spec)
_spec.loader.exec_module(_module)
_module.check_when_imported(report=_os.environ.get("COMMHOOKS_LAB_FIGURE_REPORT") or None)
del _util, _os, _sys, _spec, _module
"""


def write_ipython_startup(ipython_dir) -> None:
    """An IPython folder (point ``IPYTHONDIR`` at it) whose kernels check figures on ``plt.show()``."""
    from pathlib import Path

    startup = Path(ipython_dir) / "profile_default" / "startup"
    startup.mkdir(parents=True, exist_ok=True)
    (startup / "00-commhooks-lab-figure-check.py").write_text(STARTUP.format(path=str(Path(__file__).resolve())))
