"""Small helpers every layer may use: hush a logger PyTorch fills with notes the lab expects, resolve
``"module:function"`` strings (hooks and model factories named on a command line), and wrap a figure's titles
so that they fit it."""

from __future__ import annotations

import contextlib
import importlib
import logging
from typing import Any

__all__ = ["fit_titles", "import_object", "quiet_logger"]


@contextlib.contextmanager
def quiet_logger(name: str, level: int = logging.ERROR):
    """Raise logger ``name`` to ``level`` for the block (errors still show), then put its level back."""
    logger = logging.getLogger(name)
    saved = logger.level
    logger.setLevel(level)
    try:
        yield
    finally:
        logger.setLevel(saved)


def import_object(spec: str, what: str) -> Any:
    """Import ``attr`` from ``module`` for ``"module:attr"``; a ValueError naming ``what`` if that fails."""
    module_name, _, attr = spec.partition(":")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"cannot import {what} {spec}: {exc}") from exc


def fit_titles(fig):
    """Wrap each title of ``fig`` (axes titles, the suptitle) onto as many lines as its width needs, and return
    ``fig``: a title that states the takeaway is long, and one line ran off the figure, cut where it is shown."""
    import textwrap

    fig.draw_without_rendering()  # the layout and text sizes, without painting pixels the notebook paints again
    renderer = fig.canvas.get_renderer()
    titles = [(ax.title, ax.get_window_extent(renderer).width) for ax in fig.axes if ax.get_title()]
    suptitle = getattr(fig, "_suptitle", None)
    if suptitle is not None and suptitle.get_text():
        titles.append((suptitle, 0.97 * fig.bbox.width))
    for text, room in titles:
        width = text.get_window_extent(renderer).width
        if width > room:
            words = " ".join(text.get_text().split())
            text.set_text(textwrap.fill(words, max(20, int(len(words) * room / width * 0.95))))
    return fig
