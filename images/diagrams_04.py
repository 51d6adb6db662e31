"""Diagrams for lesson 04 (the encoder): post-LN vs pre-LN encoder layers, and LayerNorm's axis.

    python images/diagrams_04.py        # writes images/04_*.png next to this file
"""

from __future__ import annotations

import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch  # noqa: E402

DPI = 110
COLOURS = {"attn": "#f6d7a7", "ff": "#b9dcf2", "norm": "#d9ead3", "io": "#eeeeee"}


def _box(ax, x, y, text, colour, w=2.6, h=0.55):
    ax.add_patch(FancyBboxPatch((x - w / 2, y - h / 2), w, h, boxstyle="round,pad=0.04",
                                facecolor=colour, edgecolor="black", linewidth=1.2))
    ax.text(x, y, text, ha="center", va="center", fontsize=10)


def _plus(ax, x, y, r=0.2):
    ax.add_patch(plt.Circle((x, y), r, facecolor="white", edgecolor="black", linewidth=1.2))
    ax.text(x, y, "+", ha="center", va="center", fontsize=13)


def _arrow(ax, start, end, colour="black", style="-|>", connection="arc3"):
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle=style, mutation_scale=12, color=colour,
                                 linewidth=1.3, connectionstyle=connection, shrinkA=0, shrinkB=0))


def _skip(ax, x, y_from, y_to, side=1.75, colour="#c0392b"):
    """Residual path: leave the main line at y_from, run beside the boxes, join the + at y_to."""
    ax.plot([x, x + side, x + side], [y_from, y_from, y_to], color=colour, linewidth=1.6)
    _arrow(ax, (x + side, y_to), (x + 0.2, y_to), colour=colour)


def _layer(ax, x, pre_ln: bool) -> None:
    """Draw one encoder layer, bottom (input) to top (output), centred at x."""
    red = "#c0392b"
    _box(ax, x, 0.0, "input x  (B, L, d_model)", COLOURS["io"], w=3.0)
    if pre_ln:
        steps = [("LayerNorm", "norm"), ("Multi-head self-attention", "attn"), ("+", None),
                 ("LayerNorm", "norm"), ("Feed-forward", "ff"), ("+", None)]
    else:
        steps = [("Multi-head self-attention", "attn"), ("+", None), ("LayerNorm", "norm"),
                 ("Feed-forward", "ff"), ("+", None), ("LayerNorm", "norm")]
    ys, y = [], 0.0
    for text, _ in steps:
        y += 0.6 if text == "+" else 0.95
        ys.append(y)
    prev = 0.27  # top edge of the previous element
    tops = []  # top edge after each element
    for (text, kind), y in zip(steps, ys):
        half = 0.2 if text == "+" else 0.28
        _arrow(ax, (x, prev), (x, y - half))
        if text == "+":
            _plus(ax, x, y)
        else:
            _box(ax, x, y, text, COLOURS[kind])
        prev = y + half
        tops.append(prev)
    _box(ax, x, prev + 0.7, "output  (B, L, d_model)", COLOURS["io"], w=3.0)
    _arrow(ax, (x, prev), (x, prev + 0.42))
    # each residual leaves the main line halfway along the arrow into its sublayer and joins its "+"
    plus = [i for i, (t, _) in enumerate(steps) if t == "+"]
    starts = [(0.27 + ys[0] - 0.28) / 2, (tops[plus[0]] + ys[plus[0] + 1] - 0.28) / 2]
    for y_from, i in zip(starts, plus):
        ax.plot([x], [y_from], marker="o", color=red, markersize=4)
        _skip(ax, x, y_from, ys[i], colour=red)


def draw_post_vs_pre_ln(path: pathlib.Path) -> pathlib.Path:
    fig, axes = plt.subplots(1, 2, figsize=(9.6, 6.4))
    titles = ("Post-LN (the paper, BERT)\nx = LayerNorm(x + Sublayer(x))",
              "Pre-LN (GPT-2 and most newer models)\nx = x + Sublayer(LayerNorm(x))")
    for ax, pre, title in zip(axes, (False, True), titles):
        _layer(ax, 0.0, pre_ln=pre)
        ax.set_xlim(-2.2, 2.4)
        ax.set_ylim(-0.9, 6.6)
        ax.set_aspect("equal")
        ax.axis("off")
        ax.set_title(title, fontsize=11)
    axes[0].text(0.0, -0.45, "the residual stream itself passes\nthrough every LayerNorm",
                 ha="center", va="top", fontsize=9, style="italic")
    axes[1].text(0.0, -0.45, "the residual stream is never normalized;\nthe stack ends with one final LayerNorm",
                 ha="center", va="top", fontsize=9, style="italic")
    fig.text(0.5, 0.06, "red: residual (skip) connections", ha="center", color="#c0392b", fontsize=9)
    fig.savefig(path, dpi=DPI, facecolor="white", bbox_inches="tight")
    plt.close(fig)
    return path


def draw_layer_norm_axis(path: pathlib.Path) -> pathlib.Path:
    """A (L, d_model) grid of one sentence: LayerNorm's statistics run along a row (one token)."""
    L, d = 5, 8
    tokens = ["[CLS]", "the", "cat", "sat", "[SEP]"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for ax, right in zip(axes, (True, False)):
        for i in range(L):
            for j in range(d):
                hit = (i == 2) if right else (j == 3)
                colour = ("#9fd39a" if right else "#f2a7a0") if hit else "#f4f4f4"
                ax.add_patch(plt.Rectangle((j, L - 1 - i), 0.95, 0.95, facecolor=colour, edgecolor="#999999"))
        ax.set_xlim(-0.2, d + 0.1)
        ax.set_ylim(-0.1, L + 0.05)
        ax.set_yticks([L - 1 - i + 0.47 for i in range(L)], labels=tokens)
        ax.set_xticks([j + 0.47 for j in range(d)], labels=[str(j) for j in range(d)])
        ax.set_xlabel("feature (d_model axis, dim=-1)")
        ax.set_ylabel("position (sequence axis)")
        for side in ("top", "right", "left", "bottom"):
            ax.spines[side].set_visible(False)
        ax.tick_params(length=0)
    axes[0].set_title("Correct (LayerNorm): mean and variance over the\nfeatures of ONE token, x.mean(dim=-1)",
                      fontsize=10)
    axes[1].set_title("Wrong axis: statistics over the positions,\nx.mean(dim=1), which mixes tokens together",
                      fontsize=10)
    fig.savefig(path, dpi=DPI, facecolor="white", bbox_inches="tight")
    plt.close(fig)
    return path


def draw(outdir: pathlib.Path) -> list[pathlib.Path]:
    outdir.mkdir(parents=True, exist_ok=True)
    return [
        draw_post_vs_pre_ln(outdir / "04_post_vs_pre_ln.png"),
        draw_layer_norm_axis(outdir / "04_layer_norm_axis.png"),
    ]


if __name__ == "__main__":
    for p in draw(pathlib.Path(__file__).resolve().parent):
        print(f"wrote {p.name}")
