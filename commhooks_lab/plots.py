"""Pictures of what hooks do. Each function takes Result(s) and returns a matplotlib Figure;
none calls ``plt.show()`` (a notebook cell does, so that nbval sees a stable output)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator, NullLocator

from ._util import fit_titles
from .result import Result

__all__ = [
    "accuracy_over_time",
    "bytes_by_model",
    "bytes_by_world_size",
    "challenge_scores",
    "convergence_seeds",
    "error_feedback",
    "gradient_agreement",
    "link_times",
    "network_time",
    "overview",
    "resumed",
    "singular_values",
    "takeaway",
    "tradeoff",
    "tradeoff_points",
    "TradeoffPoint",
]

if TYPE_CHECKING:
    import pandas as pd

#: Below this, an error is zero to float64's eye; log axes draw it on this floor.
FLOOR = 1e-17


def _list(results) -> list[Result]:
    return [results] if isinstance(results, Result) else list(results)


def _positive(values) -> np.ndarray:
    """Values for a log axis: exact zeros drawn on the floor instead of vanishing."""
    return np.maximum(np.asarray(values, dtype=float), FLOOR)


def gradient_agreement(result: Result) -> Figure:
    """Left: do all ranks hold the same gradient (rank_spread)? Right: hook vs exact, one layer."""
    fig, (ax_spread, ax_scatter) = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True)
    s = result.steps
    ax_spread.plot(s["step"], s["rank_spread"], marker="o")
    ax_spread.set(
        xlabel="step", ylabel="rank_spread = max |h_r - h_0|", title="Do all ranks agree? (0 = DDP's invariant)"
    )
    if s["rank_spread"].max() > 0:
        ax_spread.set_yscale("log")
    else:
        ax_spread.set_ylim(-0.05, 1)
        ax_spread.text(
            0.5,
            0.5,
            "every rank holds the same gradient\n(rank_spread = 0 at every step)",
            ha="center",
            transform=ax_spread.transAxes,
        )
    sample = result.sample
    if sample:
        exact, hook = np.asarray(sample["exact"]), np.asarray(sample["hook"])
        ax_scatter.scatter(exact, hook, s=4, alpha=0.5)
        lim = float(np.abs(np.concatenate([exact, hook])).max()) or 1.0
        ax_scatter.plot([-lim, lim], [-lim, lim], color="black", linewidth=0.8, label="h = exact")
        ax_scatter.set(
            xlabel="exact mean gradient",
            ylabel="hook's gradient h",
            title=f"{sample['layer']} {tuple(sample['shape'])}, last step",
        )
        ax_scatter.legend(fontsize="small")
    return fit_titles(fig)


def _colors(results: list[Result]) -> dict[str, Any]:
    """One colour per hook, the same in every panel of a figure."""
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    return {r.name: cycle[i % len(cycle)] for i, r in enumerate(results)}


def _averaged_over(result: Result) -> str:
    """Which steps a summary averages: those that compressed, or all if the hook never compressed."""
    s, compressed = result.steps, result.compressed_steps()
    if len(compressed) == len(s):
        return ""
    steps = compressed["step"]
    return f" (steps {int(steps.min())}-{int(steps.max())})"


class TradeoffPoint(NamedTuple):
    """One hook on the bytes/error plane: where to draw it and what to call it."""

    result: Result
    x: float  # payload / fp32 payload; a hook that sends nothing sits at ``zero_x``
    y: float  # mean rel_error per step, floored for the log axis
    silent: bool  # sends 0 bytes
    label: str


def tradeoff_points(results: list[Result]) -> tuple[list[TradeoffPoint], float, float]:
    """(points, smallest nonzero x, zero_x): the trade-off's points, for the notebook's figure and the dashboard's."""
    rows = [(r, r.summary()) for r in results]
    rows = [(r, row) for r, row in rows if "rel_error" in row and row["payload_vs_fp32"] >= 0]
    sent = [row["payload_vs_fp32"] for _, row in rows if row["payload_vs_fp32"] > 0]
    smallest = min(sent, default=1.0)
    zero_x = smallest / 6  # where "sends 0 bytes" is drawn on the log axis
    points = []
    for r, row in rows:
        silent = row["payload_vs_fp32"] == 0
        label = f"{r.name}{' (sends 0 B)' if silent else ''}{_averaged_over(r)}"
        x = zero_x if silent else row["payload_vs_fp32"]
        points.append(TradeoffPoint(r, x, max(row["rel_error"], FLOOR), silent, label))
    return points, smallest, zero_x


def _draw_tradeoff(ax, results: list[Result], colors: dict[str, Any] | None = None) -> None:
    """One point per hook; a hook that sends nothing (noop) sits left of a break, at "0"."""
    colors = colors or _colors(results)
    points, smallest, zero_x = tradeoff_points(results)
    for p in points:
        ax.scatter(
            [p.x], [p.y], s=55, color=colors[p.result.name], marker="X" if p.silent else "o", label=p.label, zorder=3
        )
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="payload / fp32 allreduce payload (bytes ratio)",
        ylabel="mean rel_error per step",
        title="Bytes saved vs error paid in one step",
    )
    ax.xaxis.set_minor_locator(NullLocator())
    decades = [10.0**k for k in range(int(np.floor(np.log10(smallest))), 1) if 10.0**k > 2.5 * zero_x]
    if any(p.silent for p in points):
        ax.axvline(np.sqrt(zero_x * smallest), color="gray", linewidth=0.8, linestyle=":")
        ax.set_xticks([zero_x, *decades], ["0", *[f"{d:g}" for d in decades]])
        ax.set_xlim(zero_x / 2, 2.0)
    else:
        ax.set_xticks(decades, [f"{d:g}" for d in decades])
        ax.set_xlim(smallest / 2, 2.0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0), title="hook (steps averaged)")


def tradeoff(results: Iterable[Result]) -> Figure:
    """Bytes against error, one point per hook (log-log): the price of each byte saved."""
    fig, ax = plt.subplots(figsize=(8.5, 5), constrained_layout=True)
    _draw_tradeoff(ax, _list(results))
    return fit_titles(fig)


def takeaway(results: list[Result]) -> str:
    """The overview's title: which compressing hook saves most bytes, which keeps the error lowest."""
    rows = [r.summary() for r in results]
    compressing = [row for row in rows if "rel_error" in row and 0 < row["payload_vs_fp32"] < 1]
    if not compressing:
        return "Error per step, and bytes against error"
    fewest = min(compressing, key=lambda row: row["payload_vs_fp32"])
    closest = min(compressing, key=lambda row: row["rel_error"])
    if fewest is closest:
        return f"{fewest['hook']} sends the fewest bytes and keeps the lowest error of the compressing hooks"
    return (
        f"Of the compressing hooks, fewest bytes: {fewest['hook']} ({fewest['payload_vs_fp32']:.1%} of fp32, rel_error "
        f"{fewest['rel_error']:.2g}); lowest error: {closest['hook']} ({closest['payload_vs_fp32']:.0%} of fp32, "
        f"rel_error {closest['rel_error']:.1e})"
    )


def singular_values(result: Result, matrix_ranks: Sequence[int] = (1, 2, 4)) -> Figure:
    """Singular values of one layer's exact gradient; a matrix-rank-r cut keeps the energy left of r."""
    sample = result.sample
    if not sample or len(sample["shape"]) < 2:
        raise ValueError("singular_values needs a Result whose sample is a matrix layer (probe on)")
    rows = sample["shape"][0]
    matrix = np.asarray(sample["exact"]).reshape(rows, -1)
    sv = np.linalg.svd(matrix, compute_uv=False)
    energy = np.cumsum(sv**2) / np.sum(sv**2)
    nonzero = sv > sv[0] * 1e-10  # below that, float rounding of an exact zero
    fig, ax = plt.subplots(figsize=(7, 4.5), constrained_layout=True)
    ax.plot(np.arange(1, nonzero.sum() + 1), sv[nonzero], marker=".")
    if not nonzero.all():
        ax.text(
            0.98,
            0.97,
            f"{(~nonzero).sum()} of {len(sv)} singular values are zero: matrix rank {nonzero.sum()}",
            ha="right",
            va="top",
            fontsize="small",
            transform=ax.transAxes,
        )
    for r in matrix_ranks:
        if r <= len(sv):
            ax.axvline(r, color="gray", linestyle=":")
            ax.text(
                r,
                0.02,
                f" r={r}: {energy[r - 1]:.0%} of energy",
                rotation=90,
                fontsize="small",
                transform=ax.get_xaxis_transform(),
            )
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="index i",
        ylabel="singular value σ_i",
        title=f"{sample['layer']} {tuple(sample['shape'])}: why low rank works",
    )
    return fit_titles(fig)


def error_feedback(results: Iterable[Result], title: str | None = None) -> Figure:
    """Per-step rel_error beside cumulative_rel_error, on linear axes from 0: what error feedback trades."""
    results = _list(results)
    fig, (ax_step, ax_sum) = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True, sharey=True)
    for r in results:
        ax_step.plot(r.steps["step"], r.steps["rel_error"], marker=".", label=r.name)
        ax_sum.plot(r.steps["step"], r.steps["cumulative_rel_error"], marker=".", label=r.name)
    top = max(1.05 * max(r.steps[["rel_error", "cumulative_rel_error"]].max().max() for r in results), 1.0)
    ax_step.set(xlabel="step", ylabel="relative error", ylim=(0, top), title="Each step: rel_error of h_t")
    ax_sum.set(xlabel="step", title="Summed over steps so far: cumulative_rel_error")
    for ax in (ax_step, ax_sum):
        ax.axhline(1.0, color="gray", linewidth=0.8, linestyle=":", label="1: as far off as h = 0")
        ax.legend(fontsize="small", loc="lower left")
    if title:
        fig.suptitle(title)
    return fit_titles(fig)


def overview(results: Iterable[Result]) -> Figure:
    """The main job's picture: error per step and the bytes/error trade-off, side by side."""
    results = _list(results)
    colors = _colors(results)
    fig, (ax_err, ax_trade) = plt.subplots(
        1, 2, figsize=(14, 5), constrained_layout=True, gridspec_kw={"width_ratios": [1, 1.45]}
    )
    for r in results:
        ax_err.plot(r.steps["step"], _positive(r.steps["rel_error"]), marker=".", color=colors[r.name], label=r.name)
    ax_err.set(yscale="log", xlabel="step", ylabel="rel_error = ||h - exact|| / ||exact||", title="Error per step")
    ax_err.legend(fontsize="small", loc="upper left", bbox_to_anchor=(0.0, -0.13), ncols=3)
    _draw_tradeoff(ax_trade, results, colors)
    fig.suptitle(takeaway(results))
    return fit_titles(fig)


def _hook_style(name: str, baseline: str = "allreduce") -> dict[str, Any]:
    return {"linestyle": "--", "color": "black"} if name == baseline else {}


def network_time(
    model: pd.DataFrame, world_size: int, overlapped: pd.DataFrame | None = None, title: str | None = None
) -> Figure:
    """Modelled gradient time per step against bandwidth (log-log), one line per hook, at one world size.

    ``overlapped``: the same model with overlap > 0; its asynchronous hooks are drawn dotted beside.
    """
    table = model[model["world_size"] == world_size]
    fig, ax = plt.subplots(figsize=(9, 5), constrained_layout=True)
    lines = {}
    for name, rows in table.groupby("hook", sort=False):
        (line,) = ax.plot(rows["bandwidth_gbps"], rows["step_ms"], marker="o", label=name, **_hook_style(str(name)))
        lines[name] = line
    if overlapped is not None:
        extra = overlapped[(overlapped["world_size"] == world_size) & (overlapped["overlap"] > 0)]
        for name, rows in extra.groupby("hook", sort=False):
            color = lines[name].get_color() if name in lines else None
            share = rows["overlap"].iloc[0]
            ax.plot(rows["bandwidth_gbps"], rows["step_ms"], linestyle=":", marker=".", color=color,
                    label=f"{name}, {share:.0%} hidden by overlap")  # fmt: skip
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="link bandwidth (Gbit/s)",
        ylabel="modelled gradient time per step (ms)\ncompression work + communication",
        title=title or f"{world_size} ranks: alpha-beta model",
    )
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(True, alpha=0.3)
    return fit_titles(fig)


def link_times(table: pd.DataFrame, title: str | None = None) -> Figure:
    """Measured step time behind each link (median, with the min-max of every step as a bar) beside the model's
    (hollow), one colour per hook; ``table`` is :func:`commhooks_lab.studies.links.predict`'s."""
    links = list(dict.fromkeys(table["link"]))
    hooks = list(dict.fromkeys(table["hook"]))
    fig, ax = plt.subplots(figsize=(9, 5), constrained_layout=True)
    width = 0.8 / len(hooks)
    for i, hook in enumerate(hooks):
        rows = table[table["hook"] == hook].set_index("link")
        x = np.array([links.index(link) for link in rows.index]) + (i - (len(hooks) - 1) / 2) * width
        spread = [rows["measured_ms"] - rows["min_ms"], rows["max_ms"] - rows["measured_ms"]]
        bars = ax.errorbar(x, rows["measured_ms"], yerr=spread, fmt="o", capsize=3, label=f"{hook}, measured")
        ax.plot(x, rows["model_ms"], linestyle="none", marker="D", markerfacecolor="none",
                color=bars.lines[0].get_color(), label=f"{hook}, model")  # fmt: skip
    ax.set_xticks(range(len(links)), links)
    ax.set(yscale="log", xlabel="each rank's link", ylabel="step time (ms, log)",
           title=title or "Step time behind real links: measured (median, min-max) and modelled")  # fmt: skip
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(True, axis="y", alpha=0.3)
    return fit_titles(fig)


def accuracy_over_time(results: Iterable[Result], target: float | None = None, title: str | None = None) -> Figure:
    """Test accuracy against rank 0's training seconds (log), one colour per hook, one line per seed; ``target``
    drawn as a dashed line. The time is the sum of step times: evaluation left out."""
    fig, ax = plt.subplots(figsize=(9, 5), constrained_layout=True)
    colors: dict[str, Any] = {}
    for r in _list(results):
        steps = r.steps.set_index("step")
        seconds = steps["step_time_s"].cumsum()
        evaluated = steps["accuracy"].dropna()
        label = None if r.name in colors else r.name
        (line,) = ax.plot(seconds[evaluated.index], evaluated, marker=".", color=colors.get(r.name), label=label)
        colors.setdefault(r.name, line.get_color())
    if target is not None:
        ax.axhline(target, color="grey", linestyle="--", linewidth=1, label=f"target accuracy {target:g}")
    ax.set(xscale="log", xlabel="training time, rank 0 (s, log; evaluation left out)", ylabel="test accuracy",
           title=title or "Accuracy over training time")  # fmt: skip
    # beside the axes: the curves' places move with each run's timings, so no corner inside stays empty
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(True, alpha=0.3)
    return fit_titles(fig)


def _human(n: float) -> str:
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:g}"


def bytes_by_model(table: pd.DataFrame, title: str | None = None) -> Figure:
    """Bytes over each rank's link, as a share of the fp32 all-reduce's, for models ordered by size."""
    models = table.drop_duplicates("model").sort_values("parameters")
    positions = {m: i for i, m in enumerate(models["model"])}
    fig, ax = plt.subplots(figsize=(10, 5), constrained_layout=True)
    for name, rows in table.groupby("hook", sort=False):
        ax.plot([positions[m] for m in rows["model"]], rows["link_vs_fp32"], marker="o", label=name,
                **_hook_style(str(name)))  # fmt: skip
    ax.set_xticks(
        range(len(models)), [f"{m}\n{_human(p)} parameters" for m, p in zip(models["model"], models["parameters"])]
    )
    ax.tick_params(axis="x", labelsize="small")
    ax.set(yscale="log", ylabel="bytes over each rank's link / fp32 all-reduce's", title=title or "Bytes by model")
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(True, alpha=0.3)
    return fit_titles(fig)


def bytes_by_world_size(sweep: pd.DataFrame, title: str | None = None) -> Figure:
    """Bytes over each rank's link per step against world size (log-log): all-gathered payloads grow with W."""
    fig, ax = plt.subplots(figsize=(9, 5), constrained_layout=True)
    for name, rows in sweep.groupby("hook", sort=False):
        ax.plot(rows["world_size"], rows["link_bytes"] / 1e6, marker=".", label=name, **_hook_style(str(name)))
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="world size W (ranks)",
        ylabel="MB over each rank's link per step",
        title=title or "Bytes per link against world size",
    )
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(True, alpha=0.3)
    return fit_titles(fig)


def challenge_scores(scores: Iterable[Any], title: str | None = None) -> Figure:
    """The hook challenge's entries (``lab.challenge`` Scores), one panel per task: speed against accuracy, and
    dotted curves of equal points (accuracy x speed): an entry gains by moving right or up, and only the product
    counts. Disqualified entries have no points and are left out."""
    scored = [s for s in scores if s.value is not None]
    tasks = [t["task"] for t in scored[0].tasks] if scored else []
    fig, axes = plt.subplots(1, max(len(tasks), 1), figsize=(7 * max(len(tasks), 1), 5), constrained_layout=True,
                             squeeze=False)  # fmt: skip
    for ax, task in zip(axes[0], tasks):
        parts = [(s.label, next(t for t in s.tasks if t["task"] == task)) for s in scored]
        low = max(0.0, math.floor(10 * min(p["accuracy"] for _, p in parts) - 1) / 10)
        speed = np.linspace(1.0, 2.0, 101)
        for level in (0.8, 1.0, 1.2, 1.4, 1.6, 1.8):
            ax.plot(speed, level / speed, color="gray", linestyle=":", linewidth=0.8)
            if level / 2.0 >= low + 0.02:  # labelled where the curve meets speed 2, inside the axes
                ax.annotate(f"{level:.1f} points", (2.0, level / 2.0), fontsize="x-small", color="gray",
                            xytext=(3, 0), textcoords="offset points", va="center")  # fmt: skip
        for label, part in parts:
            ax.plot(part["speed"], part["accuracy"], marker="o", linestyle="none", label=label)
        ax.set(xlim=(0.95, 2.3), ylim=(low, 1.0), xlabel="speed: 2 t_allreduce / (t_allreduce + t_hook)",
               ylabel="test accuracy after the last step",
               title=f"{task}: on a dotted curve, equal points")  # fmt: skip
        ax.grid(True, alpha=0.3)
    if tasks:
        axes[0][-1].legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.08, 1.0))
    if title:
        fig.suptitle(title)
    return fit_titles(fig)


def convergence_seeds(results: Iterable[Result], baseline: str = "allreduce", title: str | None = None,
                      smooth: int = 10) -> Figure:  # fmt: skip
    """Training loss (a ``smooth``-step running mean; shaded: lowest to highest seed) and test accuracy
    (mean, bars: one standard deviation) per step, over the seeds of each hook."""
    results = _list(results)
    by_hook: dict[str, list[Result]] = {}
    for r in results:
        by_hook.setdefault(r.name, []).append(r)
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(14, 5), constrained_layout=True)
    width = 0.6 * float(np.diff(results[0].steps.dropna(subset=["accuracy"])["step"]).min(initial=10))
    for i, (name, runs) in enumerate(by_hook.items()):
        style = _hook_style(name, baseline)
        loss = np.array([r.steps["loss"].rolling(smooth, min_periods=1).mean().to_numpy() for r in runs])
        steps = runs[0].steps["step"].to_numpy()
        (line,) = ax_loss.plot(steps, loss.mean(axis=0), label=name, linewidth=1.4, **style)
        ax_loss.fill_between(steps, loss.min(axis=0), loss.max(axis=0), color=line.get_color(), alpha=0.12)
        evals = [r.steps.dropna(subset=["accuracy"]) for r in runs]
        acc = np.array([e["accuracy"].to_numpy() for e in evals])
        shift = width * (i / max(len(by_hook) - 1, 1) - 0.5)  # side by side, so that the bars stay readable
        at = evals[0]["step"].to_numpy() + 1 + shift  # accuracy is measured after the step's update
        sd = acc.std(0, ddof=1) if len(runs) > 1 else None
        ax_acc.errorbar(at, acc.mean(0), yerr=sd, marker="o", markersize=4, capsize=2, label=name,
                        color=line.get_color(), **{k: v for k, v in style.items() if k != "color"})  # fmt: skip
    start = float(np.mean([r.steps["loss"].iloc[0] for r in results]))
    ax_loss.axhline(start, color="gray", linestyle=":", label=f"loss at step 0 ({start:.2f}, about ln 10)")
    ax_acc.axhline(0.1, color="gray", linestyle=":", label="chance (10 classes)")
    ax_loss.set(yscale="log", xlabel="step", ylabel=f"training loss, {smooth}-step running mean",
                title="Training loss: mean over seeds, shaded from lowest to highest seed")  # fmt: skip
    ax_acc.set(xlabel="step", ylabel="test accuracy", ylim=(0, 1),
               title="Accuracy on held-out digits: mean ± one sd over seeds")  # fmt: skip
    for ax in (ax_loss, ax_acc):
        ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    seeds = max(len(runs) for runs in by_hook.values())
    fig.suptitle(title or f"{len(by_hook)} hooks, {seeds} seeds each")
    return fit_titles(fig)


def resumed(results: Iterable[Result], at: int) -> Figure:
    """Loss, cumulative_rel_error and bytes per step of runs that resumed at step ``at``: what hook state is worth.

    Runs that are bit-identical draw on top of each other; the dotted line marks the restart.
    """
    results = _list(results)
    fig, axes = plt.subplots(1, 3, figsize=(14, 4), constrained_layout=True)
    styles = ["-", "--", ":"]
    for i, r in enumerate(results):
        style = {"linestyle": styles[i % len(styles)], "marker": ".", "label": r.name}
        axes[0].plot(r.steps["step"], r.steps["loss"], **style)
        axes[1].plot(r.steps["step"], r.steps["cumulative_rel_error"], **style)
        axes[2].plot(r.steps["step"], r.steps["payload_bytes"], **style)
    axes[0].set(xlabel="step", ylabel="loss", title="Training loss")
    axes[1].set(xlabel="step", ylabel="cumulative_rel_error", title="Error of the summed gradient")
    axes[2].set(xlabel="step", ylabel="bytes", yscale="log", title="payload_bytes per step (rank 0)")
    for ax in axes:
        ax.axvline(at - 0.5, color="gray", linewidth=0.8, linestyle=":", label=f"restart (resumed at step {at})")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    # under the panels: inside one, the runs' and the restart's entries covered its curves
    fig.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", ncols=4, fontsize="small")
    return fit_titles(fig)
