"""Diagrams of lesson 14 (training at scale): data parallel, ZeRO's sharding, Megatron's MLP split.

    python images/diagrams_14.py          # writes images/14_*.png next to this file
"""

from __future__ import annotations

import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Rectangle  # noqa: E402

R0 = "#4C72B0"
R1 = "#DD8452"
SUM = "#55A868"
GREY = "#BBBBBB"
STATE = "#8172B2"


def _box(ax, x, y, w, h, text, color, fontsize=9.5, text_color="white", alpha=1.0, ls="-"):
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02", facecolor=color,
                                edgecolor="black", linewidth=0.8, alpha=alpha, linestyle=ls))
    ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=fontsize, color=text_color)


def _arrow(ax, start, end, color="black", lw=1.2, rad=0.0):
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=12, color=color, lw=lw,
                                 connectionstyle=f"arc3,rad={rad}"))


def draw_data_parallel(path: pathlib.Path) -> pathlib.Path:
    fig, ax = plt.subplots(figsize=(12, 5.6))
    ax.set_xlim(0, 12)
    ax.set_ylim(-0.7, 7.2)
    ax.axis("off")
    ax.set_title("Data parallel: the same model on every rank, a share of the batch each, "
                 "gradients averaged by one all-reduce", fontsize=11.5)
    _box(ax, 3.0, 6.1, 6.0, 0.7, "batch of B windows", "white", text_color="black")
    for i, (x0, color) in enumerate(((0.6, R0), (6.6, R1))):
        rank = f"rank {i}"
        _arrow(ax, (6.0 + (-1.5 if i == 0 else 1.5), 6.1), (x0 + 2.4, 5.55))
        _box(ax, x0, 4.85, 4.8, 0.7, f"{rank}: windows {'0 .. B/2-1' if i == 0 else 'B/2 .. B-1'}", color)
        _box(ax, x0, 3.75, 4.8, 0.75, "the whole model (same weights)\nforward, loss = mean over B/2",
             color, alpha=0.55, text_color="black")
        _box(ax, x0, 2.65, 4.8, 0.75, f"backward: g{i} = gradient of ITS half", color, alpha=0.55,
             text_color="black")
        _arrow(ax, (x0 + 2.4, 4.85), (x0 + 2.4, 4.5))
        _arrow(ax, (x0 + 2.4, 3.75), (x0 + 2.4, 3.4))
        _arrow(ax, (x0 + 2.4, 2.65), (x0 + 2.4 + (1.2 if i == 0 else -1.2), 1.95))
        _box(ax, x0, 0.25, 4.8, 0.7, "optimizer step: the same on every rank", color)
    _box(ax, 3.3, 1.25, 5.4, 0.7, "all-reduce: (g0 + g1) / 2 on both ranks", SUM)
    _arrow(ax, (4.6, 1.25), (3.0, 0.95))
    _arrow(ax, (7.4, 1.25), (9.0, 0.95))
    ax.text(6.0, -0.45, "(g0 + g1) / 2 is the gradient of the whole batch's mean loss: each half's loss "
            "is a mean over B/2", ha="center", fontsize=9, style="italic")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def draw_zero_sharding(path: pathlib.Path) -> pathlib.Path:
    fig, ax = plt.subplots(figsize=(12, 4.8))
    ax.set_xlim(0, 12.4)
    ax.set_ylim(0, 6.3)
    ax.axis("off")
    ax.set_title("What each of 2 ranks keeps (AdamW, float32: weights 4, gradients 4, two moments "
                 "8 bytes per parameter)", fontsize=11.5)
    rows = [("DDP", (1, 1), (1, 1), (1, 1)), ("ZeRO-1", (1, 1), (1, 1), (1, 0)),
            ("FSDP (ZeRO-3)", (1, 0), (1, 0), (1, 0))]
    unit = 1.0  # width of the weights of all the parameters
    for r, (name, weights, grads, state) in enumerate(rows):
        y = 4.6 - 1.9 * r
        ax.text(0.1, y + 0.35, name, fontsize=11, fontweight="bold", va="center")
        for rank in range(2):
            x = 2.3 + rank * 5.0
            ax.text(x, y + 1.0, f"rank {rank}", fontsize=9, color=(R0, R1)[rank])
            parts = [("weights", weights, 1, "#4C72B0"), ("grads", grads, 1, "#55A868"),
                     ("Adam m, v", state, 2, STATE)]
            cx = x
            for label, (first, second), size, color in parts:
                halves = (first, second)  # (this rank's half, the other half): kept?
                for h, kept in enumerate(halves):
                    w = unit * size / 2
                    own = (h == 0)
                    ax.add_patch(Rectangle((cx, y), w, 0.7, facecolor=color if kept or own else "white",
                                           edgecolor="black", lw=0.7, alpha=1.0 if own else (0.45 if kept else 1),
                                           hatch=None if kept or own else "//"))
                    cx += w
                ax.text(cx - unit * size / 2, y - 0.25, label, fontsize=8, ha="center")
                cx += 0.15
    ax.text(6.2, 0.05, "solid: this rank's half of the parameters; pale: the other half, also kept; "
            "hatched: not kept (another rank has it)", ha="center", fontsize=9, style="italic")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def draw_megatron_mlp(path: pathlib.Path) -> pathlib.Path:
    fig, ax = plt.subplots(figsize=(12.5, 5.2))
    ax.set_xlim(0, 12.5)
    ax.set_ylim(0, 6.6)
    ax.axis("off")
    ax.set_title("Megatron's MLP on 2 ranks: linear1 split by output features (columns of A), "
                 "linear2 by input features (rows of B)", fontsize=11.5)
    _box(ax, 0.2, 2.8, 1.4, 0.9, "x\n(B, T, d)", "white", text_color="black")
    _box(ax, 1.9, 2.8, 0.9, 0.9, "f", SUM)
    ax.text(2.35, 2.45, "forward: x\nbackward:\nall-reduce", ha="center", va="top", fontsize=8)
    _arrow(ax, (1.6, 3.25), (1.9, 3.25))
    for i, (y, color) in enumerate(((4.5, R0), (1.0, R1))):
        _arrow(ax, (2.8, 3.25), (3.3, y + 0.45))
        _box(ax, 3.3, y, 2.3, 0.9, f"x A{i}\nA{i}: d x d_ff/2", color)
        _box(ax, 6.0, y, 1.5, 0.9, "GELU\n(d_ff/2 features)", color, alpha=0.55, text_color="black")
        _box(ax, 7.9, y, 2.0, 0.9, f"h{i} B{i}  (partial)\nB{i}: d_ff/2 x d", color)
        _arrow(ax, (5.6, y + 0.45), (6.0, y + 0.45))
        _arrow(ax, (7.5, y + 0.45), (7.9, y + 0.45))
        _arrow(ax, (9.9, y + 0.45), (10.3, 3.25))
        ax.text(6.75, y + 1.05, f"rank {i}", ha="center", fontsize=9, color=color, fontweight="bold")
    _box(ax, 10.3, 2.8, 0.9, 0.9, "g", SUM)
    ax.text(10.75, 2.45, "forward:\nall-reduce\nbackward: id", ha="center", va="top", fontsize=8)
    _box(ax, 11.4, 2.8, 1.0, 0.9, "+ b2\n(B,T,d)", "white", text_color="black")
    _arrow(ax, (11.2, 3.25), (11.4, 3.25))
    ax.text(6.2, 0.2, "GELU is applied to whole features, so the column split needs no communication; "
            "the row split leaves sums to add: one all-reduce forward (g), one backward (f)",
            ha="center", fontsize=9, style="italic")
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def draw(outdir: pathlib.Path) -> list[pathlib.Path]:
    outdir = pathlib.Path(outdir)
    return [draw_data_parallel(outdir / "14_data_parallel.png"),
            draw_zero_sharding(outdir / "14_zero_sharding.png"),
            draw_megatron_mlp(outdir / "14_megatron_mlp.png")]


if __name__ == "__main__":
    for p in draw(pathlib.Path(__file__).resolve().parent):
        print(f"wrote {p}")
