"""Diagrams for lesson 01: the data flow of scaled dot-product attention, with the shape at every step.

    python images/diagrams_01.py     (or `make images`, which runs every diagrams_*.py)
"""

from __future__ import annotations

import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyBboxPatch  # noqa: E402

INPUT, STEP, OUTPUT, OPTIONAL = "#dbe9f6", "#fde9c9", "#d9f0d3", "#eeeeee"


def _box(ax, x, y, text, color, w=1.9, h=0.9, dashed=False):
    ax.add_patch(FancyBboxPatch((x - w / 2, y - h / 2), w, h, boxstyle="round,pad=0.04,rounding_size=0.12",
                                fc=color, ec="#444444", lw=1.2, ls="--" if dashed else "-"))
    ax.text(x, y, text, ha="center", va="center", fontsize=10)


def _arrow(ax, start, end, label=""):
    ax.annotate("", xy=end, xytext=start, arrowprops=dict(arrowstyle="-|>", color="#444444", lw=1.2))
    if label:
        ax.text((start[0] + end[0]) / 2, (start[1] + end[1]) / 2 + 0.18, label, ha="center", va="bottom",
                fontsize=8.5, color="#1f4e79")


def draw_attention_flow(path: pathlib.Path) -> pathlib.Path:
    fig, ax = plt.subplots(figsize=(14, 4.4))
    ax.set_xlim(-0.1, 16.0)
    ax.set_ylim(-1.1, 3.5)
    ax.axis("off")
    shape = dict(ha="center", va="top", fontsize=8.5, color="#1f4e79")

    _box(ax, 1.0, 2.6, "query Q\n(..., L_q, d_k)", INPUT)
    _box(ax, 1.0, 1.2, "key K\n(..., L_k, d_k)", INPUT)
    _box(ax, 1.0, -0.3, "value V\n(..., L_k, d_v)", INPUT)

    _box(ax, 3.9, 1.9, "Q @ K.transpose(-2, -1)", STEP, w=2.9)
    ax.text(3.9, 1.35, "scores (..., L_q, L_k)", **shape)
    _box(ax, 6.6, 1.9, "÷ sqrt(d_k)", STEP, w=1.6)
    ax.text(6.6, 1.35, "variance back to 1", **shape)
    _box(ax, 9.0, 1.9, "mask (optional)\nhidden → finfo.min", OPTIONAL, w=2.4, dashed=True)
    ax.text(9.0, 1.35, "bool, True = may attend,\nbroadcasts to (..., L_q, L_k)", **shape)
    _box(ax, 11.7, 1.9, "softmax(dim=-1)\nhidden → 0", STEP, w=2.2)
    _box(ax, 11.7, -0.3, "weights @ V", STEP, w=2.0)
    _box(ax, 14.9, 1.9, "weights\n(..., L_q, L_k)", OUTPUT, w=1.9)
    ax.text(14.9, 1.35, "each row sums to 1\n(0 on a fully masked row)", **shape)
    _box(ax, 14.9, -0.3, "output\n(..., L_q, d_v)", OUTPUT, w=1.9)

    _arrow(ax, (1.95, 2.45), (2.45, 2.1))
    _arrow(ax, (1.95, 1.35), (2.45, 1.7))
    _arrow(ax, (5.35, 1.9), (5.8, 1.9))
    _arrow(ax, (7.4, 1.9), (7.8, 1.9))
    _arrow(ax, (10.2, 1.9), (10.6, 1.9))
    _arrow(ax, (12.8, 1.9), (13.95, 1.9))
    _arrow(ax, (11.7, 1.45), (11.7, 0.15))
    _arrow(ax, (1.95, -0.3), (10.7, -0.3), "output row i = Σ_j weight_ij · v_j")
    _arrow(ax, (12.7, -0.3), (13.95, -0.3))

    ax.text(8.0, 3.3, "Scaled dot-product attention: softmax(Q Kᵀ / √d_k) V, with the shape at every step",
            ha="center", va="center", fontsize=12, weight="bold")
    fig.savefig(path, dpi=110, facecolor="white", bbox_inches="tight")
    plt.close(fig)
    return path


def draw(outdir: pathlib.Path) -> list[pathlib.Path]:
    outdir.mkdir(parents=True, exist_ok=True)
    return [draw_attention_flow(outdir / "01_attention_flow.png")]


if __name__ == "__main__":
    for p in draw(pathlib.Path(__file__).parent):
        print(f"wrote {p.name}")
