"""Diagram for lesson 00: the encoder-decoder Transformer, each part labelled with its lesson."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

COLORS = {
    "attn": "#f6c89f",  # lessons 01-02
    "embed": "#cfe3f7",  # lesson 03
    "ffn": "#c9ebc4",  # lesson 04
    "norm": "#f3f0a8",
    "out": "#e5d4f2",  # lesson 05-06
}


def _box(ax, x, y, w, h, text, color, lesson=None, fontsize=9):
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02,rounding_size=0.08",
                                fc=color, ec="#333333", lw=1.2))
    ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=fontsize)
    if lesson:
        ax.text(x + w + 0.08, y + h / 2, lesson, ha="left", va="center", fontsize=8,
                color="#b03a2e", fontweight="bold")


def _arrow(ax, x0, y0, x1, y1, **kw):
    ax.add_patch(FancyArrowPatch((x0, y0), (x1, y1), arrowstyle="-|>", mutation_scale=12,
                                 lw=1.2, color="#333333", **kw))


def _stack(ax, x, title, blocks, y0=3.0, label_right=False):
    """Draw one stack (encoder or decoder layer) from bottom to top; returns the top y."""
    h, gap, w = 0.55, 0.25, 3.0
    top = y0 + len(blocks) * (h + gap) + 0.1
    ax.add_patch(FancyBboxPatch((x - 0.2, y0 - 0.25), w + 0.4, top - y0 + 0.25,
                                boxstyle="round,pad=0.02,rounding_size=0.12", fc="#f7f7f7", ec="#777777",
                                lw=1.0, ls="--"))
    if label_right:
        ax.text(x + w + 0.75, (y0 + top) / 2, f"{title}\n× N", ha="left", va="center", fontsize=10)
    else:
        ax.text(x - 0.35, (y0 + top) / 2, f"{title}\n× N", ha="right", va="center", fontsize=10)
    y = y0
    for text, color, lesson in blocks:
        _box(ax, x, y, w, h, text, color, lesson)
        if y > y0:
            _arrow(ax, x + w / 2, y - gap, x + w / 2, y)
        y += h + gap
    return y - gap, x + w / 2


def draw(outdir: Path) -> list[Path]:
    fig, ax = plt.subplots(figsize=(10, 8.2))
    ax.set_xlim(0, 11)
    ax.set_ylim(0, 10.2)
    ax.axis("off")

    # inputs and embeddings (lesson 03)
    _box(ax, 1.2, 0.3, 3.0, 0.5, "source tokens", "white")
    _box(ax, 1.2, 1.3, 3.0, 0.9, "token embedding × √d_model\n+ positional encoding", COLORS["embed"], "03")
    _box(ax, 6.2, 0.3, 3.0, 0.5, "target tokens (shifted right)", "white")
    _box(ax, 6.2, 1.3, 3.0, 0.9, "token embedding × √d_model\n+ positional encoding", COLORS["embed"], "03")
    _arrow(ax, 2.7, 0.8, 2.7, 1.3)
    _arrow(ax, 7.7, 0.8, 7.7, 1.3)

    enc_top, enc_mid = _stack(ax, 1.2, "Encoder", [
        ("multi-head self-attention", COLORS["attn"], "01-02"),
        ("add & LayerNorm", COLORS["norm"], "04"),
        ("feed-forward", COLORS["ffn"], "04"),
        ("add & LayerNorm", COLORS["norm"], None),
    ])
    dec_top, dec_mid = _stack(ax, 6.2, "Decoder", [
        ("masked self-attention", COLORS["attn"], "05"),
        ("add & LayerNorm", COLORS["norm"], None),
        ("cross-attention\n(Q: decoder, K, V: encoder)", COLORS["attn"], "05"),
        ("add & LayerNorm", COLORS["norm"], None),
        ("feed-forward", COLORS["ffn"], None),
        ("add & LayerNorm", COLORS["norm"], None),
    ], label_right=True)
    _arrow(ax, 2.7, 2.2, 2.7, 3.0)
    _arrow(ax, 7.7, 2.2, 7.7, 3.0)
    # encoder output ("memory") feeds every decoder layer's cross-attention: up, right, down, in
    cross_y = 3.0 + 2 * 0.8 + 0.27
    route_y, route_x = enc_top + 0.55, 5.6
    ax.plot([enc_mid, enc_mid, route_x, route_x], [enc_top, route_y, route_y, cross_y], color="#1f5f99", lw=1.8)
    _arrow(ax, route_x, cross_y, 6.2, cross_y, ls="-")
    ax.text((enc_mid + route_x) / 2, route_y + 0.1, "memory (encoder output)", color="#1f5f99", fontsize=9,
            ha="center")

    _box(ax, 6.2, dec_top + 0.35, 3.0, 0.5, "linear (generator) + softmax", COLORS["out"], "05")
    _arrow(ax, dec_mid, dec_top, dec_mid, dec_top + 0.35)
    _box(ax, 6.2, dec_top + 1.2, 3.0, 0.5, "next-token probabilities", "white")
    _arrow(ax, dec_mid, dec_top + 0.85, dec_mid, dec_top + 1.2)
    ax.text(0.3, 9.6, "Lesson 06 trains it all on the copy task\n(teacher forcing, label smoothing,\n"
            "Noam schedule) and decodes greedily.", fontsize=9, va="top", color="#b03a2e")
    ax.set_title("The Transformer, and the lesson that builds each part (red numbers)", fontsize=12)

    path = outdir / "00_course_map.png"
    fig.savefig(path, dpi=110, facecolor="white", bbox_inches="tight")
    plt.close(fig)
    return [path]
