"""A pytest plugin on top of nbval: machine notes and variants, and ``--lab-tolerant``.

Load it with ``-p commhooks_lab.testing.plugin`` (:func:`commhooks_lab.testing.nbval_args` includes it). Always,
each cell is compared without the machine notes on either side, and with the committed outputs of this kind of
machine where the cell keeps variants (:mod:`.machine_outputs`). Without ``--lab-tolerant`` nbval's strict
comparison runs on those. With it, each checked cell is
compared by :func:`commhooks_lab.testing.notebooks.compare_outputs` (text and integers exactly, other numbers
within the cell's or notebook's stated tolerance), and the run ends with a table of every number that moved.
"""

from __future__ import annotations

import pytest

from .machine_outputs import reference_outputs, without_notes
from .notebooks import CellReport, Tolerance, compare_outputs, tolerance_of

__all__: list[str] = []

#: The name under which each compared cell's summary line travels in its test report's ``user_properties``: with
#: pytest-xdist the cells run in worker processes and only the reports reach the process that prints the summary.
_PROPERTY = "commhooks_lab.tolerant"
_SAVED_COMPARE = pytest.StashKey[object]()


def pytest_addoption(parser) -> None:
    group = parser.getgroup("nbval")
    group.addoption(
        "--lab-tolerant",
        action="store_true",
        help="with --nbval: compare numbers in outputs within the tolerances each notebook states "
        "(metadata commhooks_lab.tolerance), integers and all other text exactly (commhooks_lab.testing)",
    )


def _this_machines(test, ref, cell_metadata) -> tuple[list, list]:
    """Both sides without machine notes, and the reference this kind of machine is held to."""
    return without_notes(test), without_notes(reference_outputs(cell_metadata, ref))


def _machine_aware_compare_outputs(self, test, ref, skip_compare=None) -> bool:
    """nbval's strict ``IPyNbCell.compare_outputs`` on this machine's reference, notes left out."""
    test, ref = _this_machines(test, ref, self.cell.metadata)
    return self.config.stash[_SAVED_COMPARE](self, test, ref, skip_compare)


def _tolerant_compare_outputs(self, test, ref, skip_compare=None) -> bool:
    """nbval's ``IPyNbCell.compare_outputs``, with the notebook's tolerances instead of character for character."""
    test, ref = _this_machines(test, ref, self.cell.metadata)
    tolerance = tolerance_of(self.parent.nb.metadata, self.cell.metadata)
    report = compare_outputs(ref, test, tolerance, self.sanitize, cell=self.cell_num)
    self.user_properties.append((_PROPERTY, _summary_line(self.nodeid, tolerance, report)))
    if not report.same:
        self.comparison_traceback = [report.problem, *_moved_lines(report)]
    return report.same


def _moved_lines(report: CellReport) -> list[str]:
    return [
        f"  {m.ref} -> {m.new}  (relative {m.relative:.2g}{'' if m.allowed else ', beyond the tolerance'})"
        for m in report.moved[:20]
    ]


def _summary_line(nodeid: str, tolerance: Tolerance, report: CellReport) -> str:
    """The cell's line of the closing table; empty when nothing moved."""
    if not report.moved and report.same:
        return ""
    verdict = "ok" if report.same else "FAILED"
    return (
        f"{verdict:6} {nodeid}: {len(report.moved)} numbers moved, largest relative move "
        f"{report.largest_relative_move:.2g} (rtol {tolerance.rtol:g}, atol {tolerance.atol:g})"
    )


class _Summary:
    """Collects the compared cells' lines from the test reports (local or from xdist workers) and prints them."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def pytest_runtest_logreport(self, report) -> None:
        if report.when == "call":  # the teardown's report carries the item's properties again
            self.lines += [value for name, value in report.user_properties if name == _PROPERTY]

    def pytest_terminal_summary(self, terminalreporter) -> None:
        moved = [line for line in self.lines if line]
        terminalreporter.section("numbers that moved (--lab-tolerant)")
        if not moved:
            terminalreporter.write_line(
                f"none: all {len(self.lines)} compared cells are character for character the same"
            )
        for line in moved:
            terminalreporter.write_line(line)


def pytest_configure(config) -> None:
    tolerant = config.getoption("lab_tolerant", False)
    if tolerant and not config.getoption("nbval", False):
        raise pytest.UsageError("--lab-tolerant goes with --nbval")
    try:
        from nbval import plugin as nbval_plugin
    except ImportError:  # nbval is a test extra: without it there is nothing to compare
        return
    if tolerant:
        config.pluginmanager.register(_Summary(), "commhooks_lab-tolerant-summary")
    config.stash[_SAVED_COMPARE] = nbval_plugin.IPyNbCell.compare_outputs
    # nbval has no hook for the comparison
    nbval_plugin.IPyNbCell.compare_outputs = _tolerant_compare_outputs if tolerant else _machine_aware_compare_outputs


def pytest_unconfigure(config) -> None:
    saved = config.stash.get(_SAVED_COMPARE, None)
    if saved is not None:
        from nbval import plugin as nbval_plugin

        nbval_plugin.IPyNbCell.compare_outputs = saved
