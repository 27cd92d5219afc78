"""The figure check has teeth: each kind of unreadable figure is named, and a tidy one passes."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from commhooks_lab.testing.figure_layout import FigureLayoutError, check_figure, check_on_show  # noqa: E402


def tidy():
    fig, ax = plt.subplots(figsize=(6, 4), constrained_layout=True)
    ax.plot(np.arange(10), np.arange(10) ** 2, label="squares")
    ax.legend(loc="upper left")
    ax.set(title="Squares grow fast", xlabel="n", ylabel="n² (count)")
    return fig, ax


def whats(fig) -> list[str]:
    try:
        return [p.what for p in check_figure(fig)]
    finally:
        plt.close(fig)


def test_a_tidy_figure_passes():
    assert whats(tidy()[0]) == []


@pytest.mark.parametrize(
    "spoil, says",
    [
        (lambda fig, ax: ax.set_title("a title far too long to fit the width of this small figure " * 2), "outside"),
        (lambda fig, ax: [ax.text(x, 50, f"note {x}", fontsize=14) for x in (0.5, 0.6)], "overlaps"),
        (lambda fig, ax: ax.legend(loc="lower right", fontsize=30), "covers"),
        (lambda fig, ax: ax.text(4, 20, "a note on the line", fontsize=12), "the note 'a note on the line' covers"),
        (lambda fig, ax: ax.set_ylabel(""), "has no label"),
        (lambda fig, ax: ax.set_yticks([50]), "one tick"),
    ],
    ids=["cut-off title", "texts collide", "legend on data", "note on data", "no unit", "one tick"],
)
def test_each_kind_of_unreadable_figure_is_named(spoil, says):
    fig, ax = tidy()
    spoil(fig, ax)
    found = whats(fig)
    assert found and all(isinstance(w, str) for w in found)
    assert any(says in w for w in found), found


def test_show_raises_naming_the_problem(monkeypatch):
    monkeypatch.setattr(plt, "show", lambda *a, **k: None)
    check_on_show()
    fig, ax = tidy()
    ax.set_xlabel("")
    with pytest.raises(FigureLayoutError, match=r"x axis of 'Squares grow fast' has no label"):
        plt.show()
    assert plt.get_fignums() == []
    tidy()
    plt.show()  # a tidy figure is shown
    plt.close("all")


@pytest.mark.parametrize("last_ready", [0.2, 0.9, 0.99])
def test_the_bucket_timeline_reads_at_a_glance_wherever_the_timings_put_its_lines(last_ready):
    """Its lines' places move with each run's timings (a CI run's put one under an inside legend)."""
    import pandas as pd

    from commhooks_lab.studies import overlap

    rows = [
        {
            "hook": hook,
            "rank": 0,
            "repeat": 0,
            "ready": ready,
            "returned": ready + 0.005,
            "done": ready + 0.01,
            "end": last_ready + 0.01,
        }
        for hook in ("allreduce", "fp16")
        for ready in np.linspace(0.0, last_ready, 6)
    ]
    assert whats(overlap.plot_timeline(pd.DataFrame(rows))) == []
