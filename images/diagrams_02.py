"""Diagrams for lesson 02: how split_heads / merge_heads move the numbers.

    python images/diagrams_02.py        # writes images/02_*.png next to this file

One batch row, L = 4 tokens ("time flies like arrow"), d_model = 6, num_heads = 3, head_dim = 2.
Every cell is labelled with its token's initial and its feature index (``f3`` = feature 3 of
"flies") and coloured by the head its feature belongs to, so you can follow each number.
"""

from __future__ import annotations

import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, Rectangle  # noqa: E402

TOKENS = ["time", "flies", "like", "arrow"]
L, D_MODEL, H = 4, 6, 3
HD = D_MODEL // H
HEAD_COLORS = ["#a6cee3", "#fdbf6f", "#b2df8a"]  # head 0 blue, head 1 orange, head 2 green
EDGE = ["#1f78b4", "#e66101", "#33a02c"]


def _cell(ax, x, y, pos, feat, size=1.0):
    """Draw the number x[pos, feat] as a labelled square with its top-left corner at (x, y)."""
    head = feat // HD
    ax.add_patch(Rectangle((x, y), size, size, facecolor=HEAD_COLORS[head], edgecolor="white", lw=1.5))
    ax.text(x + size / 2, y + size / 2, f"{TOKENS[pos][0]}{feat}", ha="center", va="center", fontsize=11)


def _frame(ax, x, y, w, h, color="black", lw=1.6):
    ax.add_patch(Rectangle((x, y), w, h, fill=False, edgecolor=color, lw=lw))


def _arrow(ax, start, end, text, text_xy, rad=0.0, color="black"):
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=18, lw=1.8, color=color,
                                 connectionstyle=f"arc3,rad={rad}"))
    ax.text(*text_xy, text, ha="center", va="center", fontsize=10.5, family="monospace", color=color)


def _token_rows(ax, x, y, title, subtitle):
    """(L, d_model): one row per token, the 6 features left to right."""
    for p in range(L):
        ax.text(x - 0.2, y + p + 0.5, TOKENS[p], ha="right", va="center", fontsize=11)
        for f in range(D_MODEL):
            _cell(ax, x + f, y + p, p, f)
    _frame(ax, x, y, D_MODEL, L)
    ax.text(x + D_MODEL / 2, y - 1.1, title, ha="center", fontsize=12, weight="bold")
    ax.text(x + D_MODEL / 2, y - 0.45, subtitle, ha="center", fontsize=10, family="monospace")
    for f in range(D_MODEL):
        ax.text(x + f + 0.5, y + L + 0.35, f"d{f}", ha="center", va="center", fontsize=8, color="dimgray")


def _head_stack(ax, x, y, blocks, title, subtitle, gap=0.8):
    """(h, L, head_dim): one (L, head_dim) block per head, stacked; blocks[h][row][col] = (pos, feat)."""
    ax.text(x + HD / 2, y - 1.1, title, ha="center", fontsize=12, weight="bold")
    ax.text(x + HD / 2, y - 0.45, subtitle, ha="center", fontsize=10, family="monospace")
    for h, block in enumerate(blocks):
        top = y + h * (L + gap)
        for r, row in enumerate(block):
            for c, (pos, feat) in enumerate(row):
                _cell(ax, x + c, top + r, pos, feat)
        _frame(ax, x, top, HD, L, color=EDGE[h], lw=2.2)
        ax.text(x + HD + 0.25, top + L / 2, f"head {h}\n(L × head_dim)", ha="left", va="center", fontsize=10,
                color=EDGE[h])


def _correct_blocks():
    return [[[(p, h * HD + c) for c in range(HD)] for p in range(L)] for h in range(H)]


def _straight_reshape_blocks():
    """What x.reshape(h, L, head_dim) does: read row by row, cut into pieces of head_dim."""
    flat = [(p, f) for p in range(L) for f in range(D_MODEL)]
    return [[[flat[(h * L + r) * HD + c] for c in range(HD)] for r in range(L)] for h in range(H)]


def draw_split_merge(path: pathlib.Path) -> pathlib.Path:
    fig, ax = plt.subplots(figsize=(14, 8.2))
    # 1) (L, d_model)
    _token_rows(ax, 1.2, 5.0, "x: (B, L, d_model)", "one batch row: 4 × 6")
    # 2) view (L, h, head_dim): the same numbers, each token's row cut into 3 heads
    bx, by = 11.0, 5.0
    for p in range(L):
        ax.text(bx - 0.2, by + p + 0.5, TOKENS[p], ha="right", va="center", fontsize=11)
        for h in range(H):
            for c in range(HD):
                _cell(ax, bx + h * (HD + 0.35) + c, by + p, p, h * HD + c)
            _frame(ax, bx + h * (HD + 0.35), by + p, HD, 1, color=EDGE[h], lw=1.4)
    for h in range(H):
        ax.text(bx + h * (HD + 0.35) + HD / 2, by + L + 0.35, f"head {h}", ha="center", fontsize=9, color=EDGE[h])
    w_b = H * HD + (H - 1) * 0.35
    ax.text(bx + w_b / 2, by - 1.1, ".view(B, L, num_heads, head_dim)", ha="center", fontsize=12, weight="bold",
            family="monospace")
    ax.text(bx + w_b / 2, by - 0.45, "(B, L, h, head_dim): same memory, no copy", ha="center", fontsize=10)
    # 3) transpose -> (h, L, head_dim)
    _head_stack(ax, 22.0, 1.0, _correct_blocks(), ".transpose(1, 2)", "(B, h, L, head_dim)")
    # arrows between the panels
    _arrow(ax, (7.6, 7.0), (9.7, 7.0), "split", (8.65, 6.5))
    _arrow(ax, (18.5, 7.0), (20.8, 7.0), "", (0, 0))
    ax.text(19.65, 6.0, "heads\nbefore\npositions", ha="center", va="center", fontsize=9)
    ax.text(bx - 1.0, 11.1, "Each head is now an (L × head_dim) matrix of its own:\n"
            "attention runs over the positions of every head\nat once (batched over B and h).", ha="left", va="center",
            fontsize=10.5)
    # merge arrow back along the bottom
    _arrow(ax, (21.6, 13.0), (4.2, 10.2), "", (0, 0), rad=-0.3, color="#7b3294")
    ax.text(12.0, 15.6, "merge_heads: .transpose(1, 2) back to (B, L, h, head_dim),\n"
            "then .reshape(B, L, d_model)  = concatenate the heads", ha="center", va="center", fontsize=10.5,
            family="monospace", color="#7b3294")
    ax.text(1.2, 2.6, "Cell 'f3' = feature 3 of 'flies'; colour = the head that feature belongs to.",
            ha="left", va="center", fontsize=10, color="dimgray")
    ax.set_xlim(-0.5, 27.5)
    ax.set_ylim(16.6, -0.8)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title("split_heads and merge_heads (L = 4, d_model = 6, num_heads = 3, head_dim = 2)", fontsize=14)
    fig.savefig(path, dpi=110, facecolor="white", bbox_inches="tight")
    plt.close(fig)
    return path


def draw_reshape_without_transpose(path: pathlib.Path) -> pathlib.Path:
    fig, ax = plt.subplots(figsize=(12, 7.4))
    _token_rows(ax, 1.2, 5.0, "x: (B, L, d_model)", "one batch row: 4 × 6")
    _head_stack(ax, 11.5, 1.0, _straight_reshape_blocks(), "WRONG", ".reshape(B, h, L, hd)")
    _head_stack(ax, 20.0, 1.0, _correct_blocks(), "right", ".view(...).transpose(1, 2)")
    _arrow(ax, (7.6, 7.0), (10.6, 7.0), "", (0, 0), color="#b2182b")
    ax.text(0.2, 12.6, "The straight reshape reads x row by row\n"
            "and cuts it into pieces of head_dim:\n"
            "'head 0' gets all of 'time' and the start\n"
            "of 'flies'; its rows are no longer tokens.\n"
            "The shape is right, so nothing crashes:\n"
            "only the values are wrong.",
            ha="left", va="center", fontsize=10.5, color="#b2182b")
    ax.set_xlim(-0.5, 25.0)
    ax.set_ylim(16.0, -1.2)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title("Pitfall: reshaping straight to (B, num_heads, L, head_dim) scrambles the heads", fontsize=14)
    fig.savefig(path, dpi=110, facecolor="white", bbox_inches="tight")
    plt.close(fig)
    return path


def draw(outdir: pathlib.Path) -> list[pathlib.Path]:
    outdir = pathlib.Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    return [
        draw_split_merge(outdir / "02_split_merge_heads.png"),
        draw_reshape_without_transpose(outdir / "02_reshape_without_transpose.png"),
    ]


if __name__ == "__main__":
    for p in draw(pathlib.Path(__file__).parent):
        print(f"wrote {p.name}")
