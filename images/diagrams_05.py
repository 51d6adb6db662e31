"""Diagrams of lesson 05 (the decoder): cross-attention, and the encoder-decoder data flow.

    python images/diagrams_05.py          # writes images/05_*.png next to this file
"""

from __future__ import annotations

import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Rectangle  # noqa: E402

DEC = "#4C72B0"  # decoder / queries
ENC = "#DD8452"  # encoder / memory / keys and values
MIX = "#55A868"  # scores / output
GREY = "#8C8C8C"
DPI = 110


def _box(ax, x, y, w, h, text, color, fontsize=10, text_color="white", alpha=1.0, style="round,pad=0.02"):
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle=style, facecolor=color, edgecolor="black",
                                linewidth=0.8, alpha=alpha))
    ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=fontsize, color=text_color)


def _arrow(ax, start, end, color="black", lw=1.2, style="-|>", ls="-", rad=0.0):
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle=style, mutation_scale=12, color=color, lw=lw,
                                 linestyle=ls, connectionstyle=f"arc3,rad={rad}"))


def _matrix(ax, x, y, w, h, color, label, rows=None, cols=None):
    ax.add_patch(Rectangle((x, y), w, h, facecolor=color, edgecolor="black", lw=0.8, alpha=0.85))
    ax.text(x + w / 2, y + h / 2, label, ha="center", va="center", fontsize=10, color="white", fontweight="bold")
    if rows:
        ax.text(x - 0.08, y + h / 2, rows, ha="right", va="center", fontsize=9, rotation=90)
    if cols:
        ax.text(x + w / 2, y + h + 0.08, cols, ha="center", va="bottom", fontsize=9)


def draw_cross_attention(path: pathlib.Path) -> pathlib.Path:
    """Queries from the decoder, keys and values from the encoder output (memory)."""
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(14, 5.6), gridspec_kw={"width_ratios": [1.15, 1]})
    fig.patch.set_facecolor("white")

    # Left: who talks to whom. Decoder positions (queries) at the top, memory (keys, values) below.
    ax.set_xlim(-0.6, 6.0)
    ax.set_ylim(-0.9, 4.4)
    ax.axis("off")
    ax.set_title("Cross-attention: every target position looks at the whole source", fontsize=11)
    tgt = ["<sos>", "le", "chat", "dort"]
    src = ["the", "cat", "is", "sleeping", "<pad>"]
    # toy weights (rows sum to 1, the <pad> column is masked to 0)
    weights = [
        [0.55, 0.20, 0.10, 0.15, 0.0],
        [0.70, 0.15, 0.05, 0.10, 0.0],
        [0.10, 0.75, 0.05, 0.10, 0.0],
        [0.05, 0.10, 0.25, 0.60, 0.0],
    ]
    tx = [0.55 + 1.3 * i for i in range(len(tgt))]
    sx = [0.15 + 1.15 * j for j in range(len(src))]
    y_t, y_s = 3.4, 0.6
    for j, (x, tok) in enumerate(zip(sx, src)):
        pad = tok == "<pad>"
        _box(ax, x - 0.48, y_s - 0.3, 0.96, 0.6, tok, GREY if pad else ENC, alpha=0.5 if pad else 1.0)
    for i, (x, tok) in enumerate(zip(tx, tgt)):
        _box(ax, x - 0.48, y_t - 0.3, 0.96, 0.6, tok, DEC)
        for j, w in enumerate(weights[i]):
            if w > 0:
                ax.plot([x, sx[j]], [y_t - 0.32, y_s + 0.32], color=DEC if i == 2 else GREY,
                        lw=0.6 + 7 * w, alpha=0.85 if i == 2 else 0.35, solid_capstyle="round", zorder=0)
    ax.text(tx[2] + 0.55, y_t - 0.75, "query 'chat' puts\n0.75 on 'cat'", fontsize=9, color=DEC, va="top")
    ax.text(-0.5, y_t + 0.65, "decoder states x (B, L_t, d_model): give the QUERIES  Q = x W^Q",
            fontsize=10, color=DEC, fontweight="bold")
    ax.text(-0.5, y_s - 0.75, "encoder output memory (B, L_s, d_model): gives the KEYS  K = memory W^K\n"
            "and VALUES  V = memory W^V;  memory_mask hides <pad> (weight 0)",
            fontsize=10, color=ENC, fontweight="bold", va="top")
    ax.text(5.95, 2.0, "line width =\nattention weight", fontsize=9, ha="right", color="black")

    # Right: the shapes. Q (L_t x d_k) @ K^T (d_k x L_s) -> scores (L_t x L_s) -> softmax -> @ V.
    ax2.set_xlim(0, 13.2)
    ax2.set_ylim(0, 5.6)
    ax2.axis("off")
    ax2.set_title("The shapes (one head): the output has one row per TARGET position", fontsize=11)
    u = 0.42  # size of one cell
    L_t, L_s, d = 4, 5, 3
    y0 = 2.6
    mid = y0 + L_t * u / 2
    _matrix(ax2, 0.8, y0, d * u, L_t * u, DEC, "Q", rows="L_t = 4", cols="d_k")
    ax2.text(2.45, mid, "@", fontsize=14, ha="center", va="center")
    _matrix(ax2, 2.9, y0 + 0.2, L_s * u, d * u, ENC, "K^T", cols="L_s = 5")
    ax2.text(5.4, mid, "=", fontsize=14, ha="center", va="center")
    sx0 = 6.3
    _matrix(ax2, sx0, y0, L_s * u, L_t * u, MIX, "scores", cols="L_s (source)", rows="L_t (target)")
    ax2.add_patch(Rectangle((sx0 + (L_s - 1) * u, y0), u, L_t * u, facecolor="white", edgecolor="black",
                            hatch="///", lw=0.8, alpha=0.9))  # the masked <pad> column
    ax2.text(sx0 + (L_s - 0.5) * u, y0 - 0.1, "<pad>\nmasked", fontsize=8, ha="center", va="top")
    _arrow(ax2, (sx0 + L_s * u + 0.1, mid), (10.0, mid))
    ax2.text(9.25, mid + 0.12, "softmax\nover L_s", fontsize=8.5, ha="center", va="bottom")
    ax2.text(10.5, mid, "@ V", fontsize=12, ha="center", va="center", color=ENC, fontweight="bold")
    _matrix(ax2, 11.6, y0, d * u, L_t * u, DEC, "out", cols="d_v")
    ax2.text(
        0.5, 1.5,
        "Q: (B, h, L_t, d_k)   K, V: (B, h, L_s, d_k)\n"
        "weights = softmax(Q K^T / sqrt(d_k)): (B, h, L_t, L_s), rectangular\n"
        "out = weights @ V: (B, h, L_t, d_k) -> merge heads -> (B, L_t, d_model)\n"
        "Q comes from the decoder, K and V from the encoder: L_t and L_s may differ.",
        fontsize=9, va="top", family="monospace",
    )
    fig.tight_layout()
    fig.savefig(path, dpi=DPI, facecolor="white")
    plt.close(fig)
    return path


def draw_encoder_decoder(path: pathlib.Path) -> pathlib.Path:
    """The full encoder-decoder: where memory goes, where the masks act, which weights are tied."""
    fig, ax = plt.subplots(figsize=(12, 7.2))
    fig.patch.set_facecolor("white")
    ax.set_xlim(0, 12)
    ax.set_ylim(0, 10.3)
    ax.axis("off")
    ax.set_title("Encoder-decoder data flow (post-LN, N layers each)", fontsize=12)

    # encoder column
    ex, w = 0.6, 3.6
    _box(ax, ex, 0.4, w, 0.7, "src ids (B, L_s)  'the cat is sleeping <pad>'", "white", 9, "black")
    _box(ax, ex, 1.6, w, 0.8, "src_embed: token x sqrt(d_model)\n+ sinusoidal position, dropout", ENC, 9)
    ax.add_patch(Rectangle((ex - 0.2, 2.85), w + 0.4, 3.9, fill=False, ls="--", lw=1, edgecolor=ENC))
    ax.text(ex - 0.15, 6.55, "x N encoder layers", fontsize=9, color=ENC, va="top")
    _box(ax, ex, 3.1, w, 0.9, "self-attention (all positions)\nmask: source padding (B, 1, L_s)", ENC, 9)
    _box(ax, ex, 4.6, w, 0.9, "feed-forward\n(each with add & norm)", ENC, 9)
    _box(ax, ex, 7.3, w, 0.8, "memory (B, L_s, d_model)\n= output of the LAST encoder layer", ENC, 9)
    for y0, y1 in ((1.1, 1.6), (2.4, 3.1), (4.0, 4.6), (5.5, 7.3)):
        _arrow(ax, (ex + w / 2, y0), (ex + w / 2, y1))

    # decoder column
    dx = 6.4
    _box(ax, dx, 0.4, w + 0.9, 0.7, "tgt ids (B, L_t)  '<sos> le chat dort'  (shifted right)", "white", 9, "black")
    _box(ax, dx, 1.6, w + 0.9, 0.8, "tgt_embed: token x sqrt(d_model)\n+ sinusoidal position, dropout", DEC, 9)
    ax.add_patch(Rectangle((dx - 0.2, 2.85), w + 1.3, 5.15, fill=False, ls="--", lw=1, edgecolor=DEC))
    ax.text(dx + w + 1.05, 7.9, "x N decoder layers", fontsize=9, color=DEC, va="top", ha="right")
    _box(ax, dx, 3.1, w + 0.9, 0.9, "1. masked self-attention (Q, K, V from x)\n"
         "mask: padding AND causal (B, L_t, L_t)", DEC, 9)
    _box(ax, dx, 4.6, w + 0.9, 0.9, "2. cross-attention: Q from x, K and V from memory\n"
         "mask: source padding (B, 1, L_s)", MIX, 9)
    _box(ax, dx, 6.1, w + 0.9, 0.9, "3. feed-forward\n(each sublayer: x = norm(x + sublayer(x)))", DEC, 9)
    _box(ax, dx, 8.3, w + 0.9, 0.7, "generator: Linear(d_model, vocab) -> logits (B, L_t, vocab)", DEC, 9)
    _box(ax, dx, 9.4, w + 0.9, 0.6, "softmax -> next-token probabilities", "white", 9, "black")
    for y0, y1 in ((1.1, 1.6), (2.4, 3.1), (4.0, 4.6), (5.5, 6.1), (7.0, 8.3), (9.0, 9.4)):
        _arrow(ax, (dx + (w + 0.9) / 2, y0), (dx + (w + 0.9) / 2, y1))
    # memory -> cross-attention of every decoder layer
    _arrow(ax, (ex + w, 7.7), (dx, 5.05), color=ENC, lw=2.2, rad=-0.25)
    ax.text(5.3, 7.15, "the same memory\nfeeds EVERY\ndecoder layer", fontsize=9, color=ENC, ha="center")

    # tying
    ax.text(ex, 9.55, "Weight tying (paper, section 3.4), tie_embeddings='all':\n"
            "src_embed table = tgt_embed table = generator.weight\n"
            "one (vocab, d_model) Parameter, counted once", fontsize=9.5, va="center",
            bbox=dict(boxstyle="round", facecolor="#f2f2f2", edgecolor=GREY))
    _arrow(ax, (dx, 8.65), (ex + w + 0.25, 9.35), color=GREY, ls="--", style="<|-|>", rad=0.1)
    _arrow(ax, (dx, 2.0), (ex + w, 2.0), color=GREY, ls="--", style="<|-|>")
    ax.text((ex + w + dx) / 2, 2.1, "shared table", fontsize=8.5, color=GREY, ha="center", va="bottom")
    fig.tight_layout()
    fig.savefig(path, dpi=DPI, facecolor="white")
    plt.close(fig)
    return path


def draw(outdir: pathlib.Path) -> list[pathlib.Path]:
    outdir = pathlib.Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    return [
        draw_cross_attention(outdir / "05_cross_attention.png"),
        draw_encoder_decoder(outdir / "05_encoder_decoder.png"),
    ]


if __name__ == "__main__":
    for p in draw(pathlib.Path(__file__).parent):
        print(f"wrote {p.name}")
