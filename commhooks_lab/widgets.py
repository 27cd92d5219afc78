"""HookLab: pick a hook and its options, click Run, watch a real DDP run measure it.

The dashboard runs on the session's warm ranks (:mod:`commhooks_lab.launcher.session`, shared with
``lab.run``, started in the background when the dashboard is made), so a click costs its steps,
not a start-up. Its figures are bqplot marks updated in place (:mod:`commhooks_lab.live_plots`): the
error and rank-spread curves grow by one point per step while the ranks train, and nothing is
redrawn in the kernel. The runs table is HTML, so what the dashboard shows is plain widget state: a
test can drive it in the kernel (``board.run_button.click()``) and read exactly what a browser draws.
"""

from __future__ import annotations

import html
import threading
import time

import ipywidgets as w

from .engine.config import ExperimentConfig
from .engine.models import TASKS
from .experiment import run
from .hooks import registry
from .launcher import Cluster, Ranks, RankSpec, session
from .live_plots import LiveFigures, close_widgets
from .result import ResultSet
from .studies.availability import available_hooks

__all__ = ["HookLab", "LINK_CHOICES"]

#: The dashboard's links: the machine's own loopback, or every rank behind a link of its own.
LINK_CHOICES = [("none (this machine's loopback)", "none"), ("1 Gbit/s", "1gbit"), ("100 Mbit/s", "100mbit"),
                ("10 Mbit/s", "10mbit")]  # fmt: skip


#: State options the dashboard leaves to code, rarely what a learner explores: PowerSGD's tuning knobs, a
#: compressor's seed. Every other option of a hook shows, starting at its short-run value.
LEFT_TO_CODE = (
    "orthogonalization_epsilon",
    "random_seed",
    "compression_stats_logging_frequency",
    "batch_tensors_with_same_shape",
    "seed",
)
#: Options shown as floats whatever their default's type (PyTorch documents min_compression_rate as a float).
FLOAT_OPTIONS = ("min_compression_rate",)


def shown_options(entry: registry.HookEntry) -> dict:
    """The options the dashboard shows for ``entry``, with their starting values (its short-run options)."""
    shown = entry.options_with_defaults(entry.short_run())
    return {k: float(v) if k in FLOAT_OPTIONS else v for k, v in shown.items() if k not in LEFT_TO_CODE}


def _option_widget(name: str, default, style: dict) -> w.Widget:
    """A control for one state option, by the type of its default."""
    if isinstance(default, bool):
        return w.Checkbox(value=default, description=name)
    if isinstance(default, int):
        return w.IntText(value=default, description=name, style=style)
    if isinstance(default, str):  # ring16's dtype, DiLoCo's compress
        return w.Text(value=default, description=name, style=style)
    return w.FloatText(value=default, description=name, style=style)


def _unavailable_html() -> str:
    table = available_hooks()
    rows = table[~table["runs_here"]]
    items = "".join(
        f"<li><code>{html.escape(r['name'])}</code>: {html.escape(r['note'])}</li>" for _, r in rows.iterrows()
    )
    return f"<details><summary>PyTorch hooks not offered here ({len(rows)})</summary><ul>{items}</ul></details>"


class HookLab:
    """The dashboard. ``HookLab()`` then display it (``display(lab)`` or make it a cell's last line)."""

    def __init__(
        self, world_size: int = 2, steps: int = 20, model: str = "mlp", max_plotted_runs: int = 6, fresh: bool = False
    ):
        """``fresh=True``: ranks of the dashboard's own, stopped by :meth:`close`, instead of the session's."""
        style = {"description_width": "150px"}
        self._style = style
        self.hook = w.Dropdown(options=registry.hook_names(), value="fp16", description="hook", style=style)
        self.wrapper = w.Dropdown(options=registry.wrapper_names(), value="no", description="wrapper", style=style)
        #: One control per state option name, made when a hook that takes it is first chosen.
        self.options: dict[str, w.Widget] = {}
        self.options_box = w.VBox([])
        self.world_size = w.Dropdown(options=[1, 2, 3, 4], value=world_size, description="world_size", style=style)
        self.steps = w.IntSlider(value=steps, min=2, max=200, description="steps", style=style)
        self.model = w.Dropdown(options=list(TASKS), value=model, description="model", style=style)
        self.link = w.Dropdown(
            options=LINK_CHOICES, value="none", description="link", style=style, layout=w.Layout(width="max-content")
        )  # its first choice is long: the default width cut it
        self.link_note = w.HTML("")
        self.run_button = w.Button(description="Run", button_style="primary", icon="play")
        self.progress = w.IntProgress(value=0, min=0, max=steps, description="steps done")
        self.status = w.HTML("ready: nothing has run yet")
        self.error = w.HTML("")
        self.figures = LiveFigures(max_plotted_runs)
        self.table = w.HTML("")
        self.results = ResultSet()
        self.cluster: Cluster | None = None  # the ranks the last click ran on
        self.fresh = fresh
        self.max_plotted_runs = max_plotted_runs
        self.last_click_s: float | None = None

        # Which of PyTorch's hooks fail here comes from trying them (seconds, once per kernel): in the background.
        self.unavailable = w.HTML("<i>trying PyTorch's other hooks on this machine...</i>")
        self._tryout = threading.Thread(target=self._fill_unavailable, name="hooklab-tryout", daemon=True)
        self._tryout.start()
        if not fresh:
            session.warm(world_size)  # the ranks start while you read the controls
        self.hook.observe(self._sync_visibility, names="value")
        self.link.observe(self._sync_link, names="value")
        self.run_button.on_click(self._on_run)
        self._sync_visibility()
        controls = w.VBox(
            [
                self.hook,
                self.wrapper,
                self.options_box,
                self.world_size,
                self.steps,
                self.model,
                self.link,
                self.link_note,
                w.HBox([self.run_button, self.progress]),
                self.status,
                self.error,
                self.unavailable,
            ]
        )
        self.widget = w.VBox(
            [
                w.HTML("<h3>HookLab: DDP communication hooks, measured</h3>"),
                controls,
                self.figures.overview,
                self.figures.agreement,
                w.HTML("<b>This session's runs</b>"),
                self.table,
            ]
        )

    # -- what the controls say -----------------------------------------------------------------
    def _fill_unavailable(self) -> None:
        try:
            self.unavailable.value = _unavailable_html()
        except Exception as exc:  # a table we could not make must not break the dashboard
            self.unavailable.value = f"<i>could not try PyTorch's other hooks: {html.escape(str(exc))}</i>"

    def _shown_options(self) -> dict:
        """The entry's dashboard options and starting values (:func:`shown_options`)."""
        return shown_options(registry.get(self.hook.value))

    def _sync_visibility(self, *_):
        entry = registry.get(self.hook.value)
        shown = self._shown_options()
        for name, start in shown.items():  # each hook starts from its own defaults (hierarchical_topk's EF is on,
            if name not in self.options:  # topk's off: a control kept from the last hook would show the wrong one)
                self.options[name] = _option_widget(name, start, self._style)
            else:
                self.options[name].value = start
        self.options_box.children = [self.options[name] for name in shown]
        takes_wrapper = entry.kind == registry.HOOK and entry.name != "no"
        self.wrapper.disabled = not takes_wrapper
        if not takes_wrapper:
            self.wrapper.value = "no"

    def config(self) -> ExperimentConfig:
        """The ExperimentConfig the controls describe (not yet checked)."""
        options = {name: self.options[name].value for name in self._shown_options()}
        return ExperimentConfig(
            hook=self.hook.value,
            wrapper=self.wrapper.value,
            state_options=options,
            world_size=self.world_size.value,
            steps=self.steps.value,
            model=self.model.value,
            link=None if self.link.value == "none" else self.link.value,
            live=True,  # each step's row comes back as it is measured: the curves grow while the ranks train
        )

    def _sync_link(self, *_) -> None:
        """Say what the chosen link does to a run's time, or why this machine cannot build one."""
        if self.link.value == "none":
            self.link_note.value = ""
            return
        from .launcher.netns_switch import why_unavailable

        why = why_unavailable()
        self.link_note.value = (
            f"<span style='color:#b00020'>no link here: {html.escape(why)}</span>"
            if why
            else "<i>each rank behind a link of its own; the runs table shows each run's median step time</i>"
        )

    # -- running ---------------------------------------------------------------------------------
    def _cluster_for(self, spec: RankSpec) -> Cluster:
        if self.cluster is not None and self.cluster.spec != spec:
            if self.fresh:
                self.cluster.close()
            self.cluster = None
        if self.cluster is None:
            self.status.value = f"starting {spec.describe()} (once)..."
            self.cluster = Ranks(fresh=self.fresh)(spec)  # fresh: the dashboard's own, which close() stops
        return self.cluster

    def _on_step(self, rank: int, event: dict) -> None:
        self.progress.value = event["step"]
        self.figures.add_rows(event.get("rows", []))

    def _on_run(self, _button=None) -> None:
        """Run what the controls say; any error lands in the dashboard, which stays usable."""
        start = time.perf_counter()
        self.run_button.disabled = True
        self.error.value = ""
        try:
            config = self.config()
            _, spec = config.checked()
            assert spec is not None
            self.progress.max, self.progress.value = config.steps, 0
            cluster = self._cluster_for(spec)
            self.status.value = f"running {html.escape(config.name)} on {config.world_size} ranks..."
            self.figures.start_run(config.name, list(self.results))
            result = run(config, cluster=cluster, on_step=self._on_step)
            self.results.append(result)
            self._render()
            self.status.value = (
                f"done: <b>{html.escape(result.name)}</b>, rel_error "
                f"{result.summary()['rel_error']:.3g}; runs this session: {len(self.results)}"
            )
        except Exception as exc:  # the message belongs in the dashboard, not in a traceback
            self.error.value = (
                f"<pre style='color:#b00020;white-space:pre-wrap'>"
                f"{html.escape(type(exc).__name__)}: {html.escape(str(exc))}</pre>"
            )
            self.status.value = "failed: see the message below; change an option and run again"
            self.figures.show(list(self.results))  # the failed run's partial curve goes
        finally:
            self.run_button.disabled = False
            self.last_click_s = time.perf_counter() - start

    def _render(self) -> None:
        self.figures.show(list(self.results))
        table = self.results.table().drop(columns=["notes"])
        table.index = [f"{i + 1}. {name}" for i, name in enumerate(table.index)]
        notes = "".join(f"<li>{html.escape(n)}</li>" for n in dict.fromkeys(self.results[-1].notes))
        self.table.value = table.to_html(float_format=lambda v: f"{v:.3g}", classes="hooklab-runs") + (
            f"<p><b>Notes on the last run</b></p><ul>{notes}</ul>" if notes else ""
        )

    # -- lifecycle -------------------------------------------------------------------------------
    def close(self) -> None:
        """Close every widget the dashboard made (the option controls of hooks not shown now and the live
        figures' marks and scales too), and stop the ranks if they are the dashboard's own (``fresh=True``).

        Waits for the background try-out of PyTorch's other hooks (a child process), so that no
        process outlives the dashboard.
        """
        if self.cluster is not None and self.fresh:
            self.cluster.close()
        self.cluster = None
        self._tryout.join()
        self.figures.close()
        close_widgets(self.widget, *self.options.values())

    def _repr_mimebundle_(self, **kwargs):
        return self.widget._repr_mimebundle_(**kwargs)
