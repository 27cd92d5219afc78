"""HookLab: pick a hook and its options, click Run, watch a real DDP run measure it.

The dashboard keeps a warm :class:`Cluster`, so after the first click a run costs its steps,
not a start-up. Plots are PNG images and the runs table is HTML, so what the dashboard shows
is plain widget state: a test can drive it in the kernel (``lab.run_button.click()``) and read
exactly what a browser would render.
"""
from __future__ import annotations

import html
import io
import time

import ipywidgets as w
import matplotlib.pyplot as plt

from .cluster import Cluster
from .config import ExperimentConfig
from .experiment import run
from .hooks import HOOKS, POWER_SGD_HOOKS, WRAPPERS, available_hooks
from .models import TASKS
from .plots import gradient_agreement, overview
from .result import ResultSet


def figure_png(fig, dpi: int = 80) -> bytes:
    """Render and close a figure: the dashboard shows bytes, never leaves figures open."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    plt.close(fig)
    return buffer.getvalue()


def _unavailable_html() -> str:
    table = available_hooks()
    rows = table[~table["runs_here"]]
    items = "".join(f"<li><code>{html.escape(r['name'])}</code>: {html.escape(r['note'])}</li>"
                    for _, r in rows.iterrows())
    return f"<details><summary>PyTorch hooks not offered here ({len(rows)})</summary><ul>{items}</ul></details>"


def _close_tree(widget: w.Widget) -> None:
    for child in getattr(widget, "children", ()):
        _close_tree(child)
    widget.close()


class HookLab:
    """The dashboard. ``HookLab()`` then display it (``display(lab)`` or make it a cell's last line)."""

    def __init__(self, world_size: int = 2, steps: int = 20, model: str = "mlp", max_plotted_runs: int = 6):
        style = {"description_width": "150px"}
        self.hook = w.Dropdown(options=list(HOOKS), value="fp16", description="hook", style=style)
        self.wrapper = w.Dropdown(options=list(WRAPPERS), value="no", description="wrapper", style=style)
        self.rank = w.BoundedIntText(value=1, min=-100, max=1024, description="matrix_approximation_rank",
                                     style=style)
        self.start_iter = w.BoundedIntText(value=2, min=-100, max=100_000, description="start_powerSGD_iter",
                                           style=style)
        self.error_feedback = w.Checkbox(value=True, description="use_error_feedback")
        self.warm_start = w.Checkbox(value=True, description="warm_start")
        self.min_rate = w.BoundedFloatText(value=2.0, min=-1.0, max=1000.0, description="min_compression_rate",
                                           style=style)
        self.powersgd_box = w.VBox([self.rank, self.start_iter, self.error_feedback, self.warm_start, self.min_rate])
        self.world_size = w.Dropdown(options=[1, 2, 3, 4], value=world_size, description="world_size", style=style)
        self.steps = w.IntSlider(value=steps, min=2, max=200, description="steps", style=style)
        self.model = w.Dropdown(options=list(TASKS), value=model, description="model", style=style)
        self.run_button = w.Button(description="Run", button_style="primary", icon="play")
        self.progress = w.IntProgress(value=0, min=0, max=steps, description="steps done")
        self.status = w.HTML("ready: nothing has run yet")
        self.error = w.HTML("")
        self.plot = w.Image(format="png", layout=w.Layout(max_width="100%"))
        self.agreement = w.Image(format="png", layout=w.Layout(max_width="100%"))
        self.table = w.HTML("")
        self.results = ResultSet()
        self.cluster: Cluster | None = None
        self.max_plotted_runs = max_plotted_runs
        self.last_click_s: float | None = None

        self.hook.observe(self._sync_visibility, names="value")
        self.run_button.on_click(self._on_run)
        self._sync_visibility()
        controls = w.VBox([self.hook, self.wrapper, self.powersgd_box, self.world_size, self.steps, self.model,
                           w.HBox([self.run_button, self.progress]), self.status, self.error,
                           w.HTML(_unavailable_html())])
        self.widget = w.VBox([w.HTML("<h3>HookLab: DDP communication hooks, measured</h3>"), controls,
                              self.plot, self.agreement, w.HTML("<b>This session's runs</b>"), self.table])

    # -- what the controls say -----------------------------------------------------------------
    def _sync_visibility(self, *_):
        hook = self.hook.value
        self.powersgd_box.layout.display = "" if hook in POWER_SGD_HOOKS else "none"
        self.wrapper.disabled = hook == "no"
        if hook == "no":
            self.wrapper.value = "no"

    def config(self) -> ExperimentConfig:
        """The ExperimentConfig the controls describe (not yet checked)."""
        options = {}
        if self.hook.value in POWER_SGD_HOOKS:
            options = {"matrix_approximation_rank": self.rank.value, "start_powerSGD_iter": self.start_iter.value,
                       "use_error_feedback": self.error_feedback.value, "warm_start": self.warm_start.value,
                       "min_compression_rate": self.min_rate.value}
        return ExperimentConfig(hook=self.hook.value, wrapper=self.wrapper.value, state_options=options,
                                world_size=self.world_size.value, steps=self.steps.value, model=self.model.value)

    # -- running ---------------------------------------------------------------------------------
    def _cluster_for(self, world_size: int) -> Cluster:
        if self.cluster is not None and self.cluster.world_size != world_size:
            self.cluster.close()
            self.cluster = None
        if self.cluster is None:
            self.status.value = f"starting {world_size} ranks (a few seconds, once)..."
            self.cluster = Cluster(world_size)
        return self.cluster

    def _on_step(self, rank: int, event: dict) -> None:
        self.progress.value = event["step"]

    def _on_run(self, _button=None) -> None:
        """Run what the controls say; any error lands in the dashboard, which stays usable."""
        start = time.perf_counter()
        self.run_button.disabled = True
        self.error.value = ""
        try:
            config = self.config()
            config.check()
            self.progress.max, self.progress.value = config.steps, 0
            cluster = self._cluster_for(config.world_size)
            self.status.value = f"running {html.escape(config.name)} on {config.world_size} ranks..."
            result = run(config, cluster=cluster, on_step=self._on_step)
            self.results.append(result)
            self._render()
            self.status.value = (f"done: <b>{html.escape(result.name)}</b>, rel_error "
                                 f"{result.summary()['rel_error']:.3g}; runs this session: {len(self.results)}")
        except Exception as exc:  # the message belongs in the dashboard, not in a traceback
            self.error.value = (f"<pre style='color:#b00020;white-space:pre-wrap'>"
                                f"{html.escape(type(exc).__name__)}: {html.escape(str(exc))}</pre>")
            self.status.value = "failed: see the message below; change an option and run again"
        finally:
            self.run_button.disabled = False
            self.last_click_s = time.perf_counter() - start

    def _render(self) -> None:
        recent = self.results[-self.max_plotted_runs:]
        self.plot.value = figure_png(overview(recent))  # figure_png closes each figure it renders
        self.agreement.value = figure_png(gradient_agreement(self.results[-1]))
        table = self.results.table().drop(columns=["notes"])
        table.index = [f"{i + 1}. {name}" for i, name in enumerate(table.index)]
        notes = "".join(f"<li>{html.escape(n)}</li>" for n in dict.fromkeys(self.results[-1].notes))
        self.table.value = table.to_html(float_format=lambda v: f"{v:.3g}", classes="hooklab-runs") + (
            f"<p><b>Notes on the last run</b></p><ul>{notes}</ul>" if notes else "")

    # -- lifecycle -------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop the ranks and close every widget."""
        if self.cluster is not None:
            self.cluster.close()
            self.cluster = None
        _close_tree(self.widget)

    def _repr_mimebundle_(self, **kwargs):
        return self.widget._repr_mimebundle_(**kwargs)
