"""Plots return the figures they promise; the dashboard does what its controls say."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import commhooks_lab as lab  # noqa: E402
from commhooks_lab import plots  # noqa: E402
from commhooks_lab.widgets import HookLab  # noqa: E402

pytestmark = pytest.mark.usefixtures("no_leftover_processes")


@pytest.fixture(scope="module")
def results():
    ef = {"matrix_approximation_rank": 1, "start_powerSGD_iter": 2}
    no_ef = {**ef, "use_error_feedback": False, "warm_start": False}
    return lab.compare(
        [
            "allreduce",
            "fp16",
            "bf16",
            {"hook": "power_sgd", "state_options": ef},
            {"hook": "power_sgd", "state_options": no_ef, "label": "power_sgd r1 no EF"},
            "noop",
        ],
        steps=4,
    )


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def test_gradient_agreement_shows_the_spread_and_every_sampled_element(results):
    fig = plots.gradient_agreement(results.by_name("noop"))
    spread_ax, scatter_ax = fig.axes
    assert spread_ax.get_yscale() == "log"  # noop: the ranks disagree
    assert len(scatter_ax.collections[0].get_offsets()) == 128 * 64
    fig = plots.gradient_agreement(results.by_name("allreduce"))
    assert "same gradient" in fig.axes[0].texts[0].get_text()


def test_tradeoff_places_every_hook_noop_at_zero_bytes(results):
    ax = plots.tradeoff(results).axes[0]
    assert len(ax.collections) == len(results)  # noop too, left of the break, at "0"
    assert ax.get_xscale() == ax.get_yscale() == "log"
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "noop (sends 0 B)" in labels and "allreduce" in labels  # allreduce: every step, no "(steps ...)"
    assert "power_sgd r1 (steps 2-3)" in labels  # PowerSGD: only the steps it compressed
    assert [t.get_text() for t in ax.get_xticklabels()][0] == "0"


def _overlaps(a, b) -> bool:
    return a.width > 0 and b.width > 0 and a.overlaps(b)


def test_overview_has_a_legend_per_panel_a_takeaway_and_no_overlapping_labels(results):
    fig = plots.overview(results)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        legend = ax.get_legend()
        assert legend is not None and len(legend.get_texts()) == len(results)
        box = legend.get_window_extent(renderer)
        assert not _overlaps(box, ax.get_window_extent(renderer))  # outside the data area
        assert not _overlaps(box, ax.xaxis.label.get_window_extent(renderer))
    title = fig.get_suptitle()
    assert title.startswith("Of the compressing hooks, fewest bytes: power_sgd r1") and "lowest error: fp16" in title
    assert "compressed steps" not in fig.axes[1].get_ylabel()  # allreduce never compresses: no such claim


def test_singular_values_draw_the_spectrum_and_the_rank_cuts(results):
    result = results.by_name("fp16")
    ax = plots.singular_values(result, matrix_ranks=(1, 4)).axes[0]
    assert [c.get_xdata()[0] for c in ax.get_lines()[1:]] == [1, 4]
    spectrum, *cuts = ax.get_lines()
    rank = np.linalg.matrix_rank(np.asarray(result.sample["exact"]).reshape(128, 64))
    assert len(spectrum.get_xdata()) == rank <= 64  # always-blank pixels give zero columns
    assert [c.get_xdata()[0] for c in cuts] == [1, 4]
    assert np.all(np.diff(spectrum.get_ydata()) <= 0)
    if rank < 64:
        assert any(f"matrix rank {rank}" in t.get_text() for t in ax.texts)


@pytest.fixture
def dashboard():
    board = HookLab(steps=4)
    yield board
    board.close()


def test_the_dashboard_runs_exactly_what_its_controls_say(dashboard):
    dashboard.hook.value = "power_sgd"
    for name, value in [
        ("matrix_approximation_rank", 2),
        ("start_powerSGD_iter", 3),
        ("use_error_feedback", False),
        ("warm_start", False),
        ("min_compression_rate", 1.5),
    ]:
        dashboard.options[name].value = value
    dashboard.wrapper.value = "fp16"
    dashboard.run_button.click()
    assert dashboard.error.value == ""
    (result,) = dashboard.results
    assert result.config["hook"] == "power_sgd" and result.config["wrapper"] == "fp16"
    assert result.config["state_options"] == {
        "matrix_approximation_rank": 2,
        "start_powerSGD_iter": 3,
        "use_error_feedback": False,
        "warm_start": False,
        "min_compression_rate": 1.5,
    }
    payload = list(result.steps["payload_bytes"])  # fp16 halves from the start; PowerSGD from step 3
    assert payload[0] == payload[2] == result.steps["uncompressed_bytes"].iloc[0] // 2 > payload[3]
    assert dashboard.progress.value == dashboard.progress.max == 4
    line = dashboard.figures.error_lines[0]  # what the browser draws: the marks' data
    assert list(line.labels) == [result.name] and list(line.x) == [0, 1, 2, 3]
    np.testing.assert_array_equal(line.y, np.maximum(result.steps["rel_error"], plots.FLOOR))
    assert [str(n) for n in dashboard.figures.points.names] == [f"1. {result.name}"]  # compressed every step
    assert "fp16_wrapper(power_sgd r2 no EF no warm start)" in dashboard.table.value
    assert not plt.get_fignums()  # the dashboard opens no matplotlib figure


def test_a_bad_option_shows_its_message_and_the_dashboard_stays_usable(dashboard):
    dashboard.hook.value = "power_sgd"
    dashboard.options["matrix_approximation_rank"].value = 0
    dashboard.run_button.click()
    assert "matrix_approximation_rank must be an int &gt;= 1, got 0" in dashboard.error.value
    assert dashboard.status.value.startswith("failed") and not dashboard.results
    assert dashboard.cluster is None  # refused before any process started
    assert not any(len(line.x) for line in dashboard.figures.error_lines)
    dashboard.options["matrix_approximation_rank"].value = 1
    dashboard.run_button.click()
    assert dashboard.error.value == "" and len(dashboard.results) == 1
    pids = dashboard.cluster.pids
    dashboard.hook.value = "fp16"
    dashboard.run_button.click()
    assert dashboard.cluster.pids == pids and len(dashboard.results) == 2  # the ranks stayed warm
    assert "1. power_sgd r1" in dashboard.table.value and "2. fp16" in dashboard.table.value


def test_controls_follow_the_hook(dashboard):
    dashboard.hook.value = "fp16"
    assert dashboard.options_box.children == ()
    dashboard.hook.value = "batched_power_sgd"
    shown = [c.description for c in dashboard.options_box.children]
    assert shown == [
        "matrix_approximation_rank",
        "start_powerSGD_iter",
        "min_compression_rate",
        "use_error_feedback",
        "warm_start",
    ]
    dashboard.wrapper.value = "bf16"
    dashboard.hook.value = "no"
    assert dashboard.wrapper.disabled and dashboard.wrapper.value == "no"
    dashboard.hook.value = "topk"
    assert [c.description for c in dashboard.options_box.children] == ["ratio", "error_feedback"]
    assert dashboard.wrapper.disabled  # a compressor makes its own payload
    dashboard._tryout.join(60)
    assert "quantization_pertensor_hook" in dashboard.unavailable.value


def test_changing_world_size_restarts_the_ranks(dashboard):
    dashboard.run_button.click()
    first = dashboard.cluster.pids
    dashboard.world_size.value = 3
    dashboard.run_button.click()
    assert len(dashboard.cluster.pids) == 3 and not set(first) & set(dashboard.cluster.pids)
    assert dashboard.results[-1].env["world_size"] == 3


def test_error_feedback_puts_per_step_and_summed_error_side_by_side(results):
    ef, no_ef = results.by_name("power_sgd r1"), results.by_name("power_sgd r1 no EF")
    fig = plots.error_feedback([ef, no_ef], title="a takeaway")
    step_ax, sum_ax = fig.axes
    assert step_ax.get_ylim()[0] == 0 and step_ax.get_yscale() == "linear"
    np.testing.assert_array_equal(sum_ax.get_lines()[0].get_ydata(), ef.steps["cumulative_rel_error"])
    for ax in fig.axes:
        labels = [t.get_text() for t in ax.get_legend().get_texts()]
        assert labels == ["power_sgd r1", "power_sgd r1 no EF", "1: as far off as h = 0"]
    assert fig.get_suptitle() == "a takeaway"


def test_the_dashboard_shows_every_registered_hooks_options():
    """Every hook in the dropdown gets a control of its options' types (a text option gets a text box)."""
    board = lab.HookLab()
    try:
        for name in board.hook.options:
            board.hook.value = name
            entry = lab.registry.get(name)
            shown = lab.widgets.shown_options(entry)
            values = {c.description: c.value for c in board.options_box.children}
            assert values == shown, name
        board.hook.value = "diloco"
        board.options["compress"].value = "bf16"
        assert board.config().state_options["compress"] == "bf16"
    finally:
        board.close()


def test_the_curves_grow_per_step_while_the_ranks_train_and_the_marks_are_updated_in_place(dashboard):
    """Each step's row arrives as an event before the run ends; a second click reuses the same marks."""
    marks = [id(m) for m in (*dashboard.figures.error_lines, dashboard.figures.points, dashboard.figures.spread_line)]
    lengths: list[tuple[int, int]] = []
    add_rows = dashboard.figures.add_rows

    def spy(rows):
        add_rows(rows)
        lengths.append((dashboard.progress.value, len(dashboard.figures.error_lines[-1].x)))

    dashboard.figures.add_rows = spy
    dashboard.hook.value = "fp16"
    dashboard.run_button.click()
    assert lengths == [(1, 1), (2, 2), (3, 3), (4, 4)]  # step k's event carries step k's measured row
    dashboard.hook.value = "power_sgd"
    dashboard.run_button.click()
    assert lengths[4:] == [(1, 1), (2, 2), (3, 3), (4, 4)]
    again = [id(m) for m in (*dashboard.figures.error_lines, dashboard.figures.points, dashboard.figures.spread_line)]
    assert again == marks
    first, second = dashboard.figures.error_lines[:2]
    assert [list(first.labels), list(second.labels)] == [["fp16"], ["power_sgd r1"]]
    assert list(first.colors) != list(second.colors)  # each run keeps its own colour
    assert not any(len(line.x) for line in dashboard.figures.error_lines[2:])


def open_widgets() -> set[str]:
    """The model ids of every widget the kernel holds open (ipywidgets 8's registry: what its deprecated
    ``Widget.widgets`` and ``Widget._active_widgets`` return)."""
    from ipywidgets.widgets import widget

    return set(widget._instances)


def test_closing_the_dashboard_closes_every_widget_it_made():
    """Controls, option controls of hooks no longer shown, layouts and styles, the bqplot marks, axes and scales:
    after close() the kernel holds exactly the widgets it held before the dashboard (it kept 85 of 118 open)."""
    before = open_widgets()
    board = HookLab(steps=2, fresh=True)
    made = len(open_widgets() - before)
    for name in board.hook.options:  # each hook's option controls, made when it is first chosen
        board.hook.value = name
    board.hook.value = "power_sgd"
    board.run_button.click()
    assert board.error.value == "" and len(board.results) == 1
    grown = len(open_widgets() - before)
    board.close()
    assert made >= 100 and grown > made  # layouts and styles are widgets too
    assert open_widgets() == before
    again = HookLab(steps=2, fresh=True)  # nothing a second dashboard needs was closed with the first
    again.hook.value = "topk"
    assert [c.description for c in again.options_box.children] == ["ratio", "error_feedback"]
    again.close()
    assert open_widgets() == before


def test_live_rows_change_no_number():
    """live=True measures each step as it ends; the steps table is the same, bit for bit, as a batched run's."""
    batched = lab.run(hook="power_sgd", state_options={"start_powerSGD_iter": 2}, steps=6)
    live = lab.run(hook="power_sgd", state_options={"start_powerSGD_iter": 2}, steps=6, live=True)
    columns = ["rel_error", "cosine", "rank_spread", "payload_bytes", "loss", "cumulative_rel_error"]
    assert batched.steps[columns].equals(live.steps[columns])
