"""Diagram of lesson 09 (GPT): lesson 05's decoder layer without its middle is a GPT block.

    python images/diagrams_09.py          # writes images/09_decoder_only.png next to this file
"""

from __future__ import annotations

import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Rectangle  # noqa: E402

DEC = "#4C72B0"
ENC = "#DD8452"
MIX = "#55A868"
GREY = "#8C8C8C"
NORM = "#8172B2"


def _box(ax, x, y, w, h, text, color, fontsize=9.5, text_color="white", alpha=1.0, ls="-"):
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02", facecolor=color,
                                edgecolor="black", linewidth=0.8, alpha=alpha, linestyle=ls))
    ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=fontsize, color=text_color)


def _arrow(ax, start, end, color="black", lw=1.2, style="-|>", ls="-", rad=0.0):
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle=style, mutation_scale=12, color=color, lw=lw,
                                 linestyle=ls, connectionstyle=f"arc3,rad={rad}"))


def draw_decoder_only(path: pathlib.Path) -> pathlib.Path:
    fig, ax = plt.subplots(figsize=(13.5, 7.4))
    fig.patch.set_facecolor("white")
    ax.set_xlim(0, 13.6)
    ax.set_ylim(0, 10.4)
    ax.axis("off")
    ax.set_title("Lesson 05's decoder layer without cross-attention is a GPT block", fontsize=12)

    # left: the pre-LN decoder layer of lesson 05
    lx, w = 0.5, 4.4
    ax.text(lx + w / 2, 9.85, "Lesson 05: decoder layer (pre-LN)", ha="center", fontsize=10.5,
            fontweight="bold", color=DEC)
    _box(ax, lx, 1.0, w, 0.7, "x (B, T, d_model)", "white", text_color="black")
    _box(ax, lx, 2.3, w, 1.2, "norm1 -> masked self-attention\n(causal mask) -> + x", DEC)
    _box(ax, lx, 4.1, w, 1.2, "norm2 -> CROSS-attention\nQ from x, K and V from the encoder's memory\n-> + x",
         GREY, alpha=0.45, text_color="black", ls="--")
    ax.plot([lx + 0.1, lx + w - 0.1], [4.15, 5.25], color="#C44E52", lw=2.5)
    ax.plot([lx + 0.1, lx + w - 0.1], [5.25, 4.15], color="#C44E52", lw=2.5)
    _box(ax, lx, 5.9, w, 1.2, "norm3 -> feed-forward -> + x", DEC)
    _box(ax, lx, 7.7, w, 0.7, "to the next layer", "white", text_color="black")
    for y0, y1 in ((1.7, 2.3), (3.5, 4.1), (5.3, 5.9), (7.1, 7.7)):
        _arrow(ax, (lx + w / 2, y0), (lx + w / 2, y1))
    _box(ax, lx + 0.3, 8.75, w - 0.6, 0.7, "memory from the encoder: not in a GPT", ENC, alpha=0.45,
         text_color="black", ls="--")

    _arrow(ax, (lx + w + 0.25, 5.0), (lx + w + 1.45, 5.0), lw=2.2)
    ax.text(lx + w + 0.85, 5.25, "remove\nthe middle", ha="center", va="bottom", fontsize=9)

    # right: GPT
    rx, rw = 6.9, 5.0
    ax.text(rx + rw / 2, 9.85, "Lesson 09: GPT (GPT-2's architecture)", ha="center", fontsize=10.5,
            fontweight="bold", color=MIX)
    _box(ax, rx, 0.2, rw, 0.65, "ids (B, T): characters 0 .. T-1", "white", text_color="black")
    _box(ax, rx, 1.2, rw, 0.85, "token vector (no sqrt(d_model))\n+ LEARNED position vector, dropout", MIX)
    ax.add_patch(Rectangle((rx - 0.2, 2.35), rw + 0.4, 3.75, fill=False, ls="--", lw=1, edgecolor=DEC))
    ax.text(rx - 0.35, 3.9, "x N layers:\nlesson 04's\nEncoderLayer,\npre-LN,\ncausal mask",
            fontsize=8.5, color=DEC, va="top", ha="right")
    _box(ax, rx, 2.6, rw, 1.2, "norm1 -> masked self-attention\n(position t sees 0 .. t) -> + x", DEC)
    _box(ax, rx, 4.4, rw, 1.2, "norm2 -> feed-forward, d_ff = 4 d_model,\nGELU (tanh form) -> + x", DEC)
    _box(ax, rx, 6.5, rw, 0.7, "final LayerNorm (ln_f)", NORM)
    _box(ax, rx, 7.6, rw, 0.85, "lm_head: the token table again (tied)\n-> logits (B, T, V)", MIX)
    _box(ax, rx, 8.8, rw, 0.6, "loss: next character at EVERY position", "white", text_color="black")
    for y0, y1 in ((0.85, 1.2), (2.05, 2.6), (3.8, 4.4), (5.6, 6.5), (7.2, 7.6), (8.45, 8.8)):
        _arrow(ax, (rx + rw / 2, y0), (rx + rw / 2, y1))
    _arrow(ax, (rx + rw, 8.0), (rx + rw, 1.6), color=GREY, ls="--", style="<|-|>", rad=-0.45)
    ax.text(rx + rw + 0.95, 1.75, "tied: one\n(V, d_model)\nmatrix", fontsize=8.5, color=GREY, ha="center")
    fig.tight_layout()
    fig.savefig(path, dpi=110, facecolor="white")
    plt.close(fig)
    return path


def draw(outdir: pathlib.Path) -> list[pathlib.Path]:
    outdir = pathlib.Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    return [draw_decoder_only(outdir / "09_decoder_only.png")]


if __name__ == "__main__":
    for p in draw(pathlib.Path(__file__).parent):
        print(f"wrote {p.name}")
