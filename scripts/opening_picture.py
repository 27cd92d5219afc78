"""Draw notebook 1's opening picture: where a DDP communication hook sits in one training step.

    python scripts/opening_picture.py    # writes docs/images/ddp_comm_hook.png

A diagram, not a measurement. It states only what holds for DDP in general, at any world size, as
``DistributedDataParallel.register_comm_hook``'s docstring in ``torch/nn/parallel/distributed.py`` says:
backward's gradients are gathered into buckets; once a bucket is ready DDP calls
``hook(state, bucket)``; the hook returns a ``Future[Tensor]`` holding the bucket's new value, which DDP
copies into each parameter's ``.grad``. DDP waits for every bucket's Future before backward returns
(the reducer's ``finalize_backward``), so there is one optimizer step per training step, not one per
bucket. A bucket holds one or more parameters' gradients (a parameter larger than the cap gets a bucket
of its own). Without a hook, DDP averages the bucket with an all-reduce; PyTorch's ``allreduce_hook``
(``default_hooks.py``) divides by the world size and all-reduces.
The picture is checked with the notebooks' own figure-layout check before it is written.
"""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Rectangle  # noqa: E402

from commhooks_lab.testing.figure_layout import check_figure  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PICTURE = ROOT / "docs" / "images" / "ddp_comm_hook.png"

LANES = {"rank 0": 3.1, "rank 1": 1.0}  # y of each rank's row; a note says there are W of them
HOOK_COLOR, GRAD_COLOR = "#fde7c8", "#d6e6f5"


def box(ax, x, y, w, h, text, color="white", size=10.5, **style):
    ax.add_patch(
        FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.04,rounding_size=0.12", fc=color, ec="0.25", lw=1.1, **style)
    )
    ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=size, linespacing=1.35)


def arrow(ax, start, end, **style):
    ax.add_patch(
        FancyArrowPatch(
            start, end, arrowstyle="-|>", mutation_scale=14, lw=1.3, color="0.2", shrinkA=2, shrinkB=2, **style
        )
    )


def bucket(ax, x, y):
    """A bucket: one flat tensor holding one or more parameters' gradients end to end (three drawn)."""
    ax.add_patch(Rectangle((x, y), 2.0, 0.62, fc="white", ec="0.25", lw=1.1))
    for i, width in enumerate((0.55, 0.35, 0.7)):
        left = x + 0.1 + sum((0.55, 0.35, 0.7)[:i]) + 0.05 * i
        ax.add_patch(Rectangle((left, y + 0.1), width, 0.42, fc=GRAD_COLOR, ec="0.4", lw=0.8))


def draw():
    fig, ax = plt.subplots(figsize=(13, 5.4))
    ax.set(xlim=(-0.2, 15.4), ylim=(-0.55, 5.15))
    ax.axis("off")
    # what a hook replaces, behind both rows
    ax.add_patch(
        FancyBboxPatch(
            (3.35, 0.45),
            7.75,
            4.05,
            boxstyle="round,pad=0.05,rounding_size=0.2",
            fc="#fff7ec",
            ec="#c77a1a",
            lw=1.4,
            ls="--",
        )
    )
    ax.text(
        7.22,
        4.7,
        "what a communication hook replaces (with no hook, DDP averages each bucket with an all-reduce)",
        ha="center",
        va="center",
        fontsize=10.5,
        color="#8a4f0c",
    )
    for name, y in LANES.items():
        ax.text(-0.1, y + 0.31, name, ha="left", va="center", fontsize=11, fontweight="bold")
        bucket(ax, 1.05, y)
        ax.text(
            2.05,
            y - 0.25,
            "a bucket: gradients of one\nor more parameters,\none flat tensor",
            ha="center",
            va="top",
            fontsize=9,
        )
        arrow(ax, (3.1, y + 0.31), (3.75, y + 0.31))
        box(ax, 3.8, y - 0.05, 2.2, 0.72, "hook(state, bucket)", HOOK_COLOR)
        arrow(ax, (6.05, y + 0.31), (7.0, y + 0.31))
        arrow(ax, (8.95, y + 0.31), (9.4, y + 0.31))
        box(ax, 9.45, y - 0.15, 1.5, 0.92, "Future[Tensor]:\nthe bucket's\nnew value", HOOK_COLOR, size=9.5)
        arrow(ax, (11.0, y + 0.31), (11.65, y + 0.31))
        box(ax, 11.7, y - 0.05, 1.55, 0.72, "copied into\neach param.grad", size=10)
        arrow(ax, (13.3, y + 0.31), (13.85, y + 0.31))
        box(ax, 13.9, y - 0.2, 1.38, 1.02, "optimizer step,\nafter every\nbucket's Future\nis done", size=9)
    collective = "a collective,\ne.g. all-reduce:\n\nevery rank\nsends its bucket,\nevery rank\ngets the sum"
    box(ax, 7.05, 0.85, 1.85, 3.0, collective, "#eef3e6", size=10)
    ax.text(
        0.0,
        -0.3,
        "backward fills the buckets; DDP calls the hook once a bucket is ready. "
        "The same happens on every one of the W ranks (two drawn here).",
        ha="left",
        va="center",
        fontsize=9.5,
    )
    ax.text(
        4.9, 2.33, "a hook may compress,\nsend less, or send nothing", ha="center", va="center", fontsize=9, color="0.3"
    )
    fig.suptitle("One DDP step, bucket by bucket: where a communication hook sits", fontsize=13)
    fig.subplots_adjust(left=0.01, right=0.99, bottom=0.01, top=0.92)
    return fig


def main() -> int:
    fig = draw()
    problems = check_figure(fig)
    if problems:
        for problem in problems:
            print(problem, file=sys.stderr)
        return 1
    PICTURE.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(PICTURE, dpi=110)
    print(f"wrote {PICTURE.relative_to(ROOT)} ({PICTURE.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
