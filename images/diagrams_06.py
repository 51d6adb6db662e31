"""Diagrams for lesson 06: teacher forcing and the one-position shift, and what a wrong shift does."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

SRC = "#e08a50"  # encoder side (as in lesson 05's diagrams)
DEC = "#4c72b0"  # decoder input
SOS = "#7b4fa0"  # the start symbol
LAB = "#4f9a5b"  # labels
PAD = "#bdbdbd"
BAD = "#c0392b"
W, H, STEP = 0.8, 0.55, 1.0  # box width, height, column spacing


def _box(ax, x, y, text, color, text_color="white", fontsize=11):
    ax.add_patch(FancyBboxPatch((x - W / 2, y - H / 2), W, H, boxstyle="round,pad=0.02,rounding_size=0.06",
                                fc=color, ec="#333333", lw=1.0))
    ax.text(x, y, text, ha="center", va="center", fontsize=fontsize, color=text_color)


def _arrow(ax, xy0, xy1, color="#333333", style="-|>", lw=1.3, ls="-", rad=0.0):
    ax.add_patch(FancyArrowPatch(xy0, xy1, arrowstyle=style, mutation_scale=12, lw=lw, color=color, ls=ls,
                                 connectionstyle=f"arc3,rad={rad}", shrinkA=2, shrinkB=2))


def _x(i: int) -> str:
    return f"$x_{{{i}}}$"


def _row(ax, y, tokens, colors, label, label_color):
    for t, (tok, col) in enumerate(zip(tokens, colors)):
        _box(ax, t * STEP, y, tok, col, text_color="black" if col == PAD else "white",
             fontsize=10 if tok.startswith("<") else 11)
    ax.text(-0.75, y, label, ha="right", va="center", fontsize=10.5, color=label_color, fontweight="bold")


def draw_teacher_forcing(path: Path) -> Path:
    L = 10
    fig, ax = plt.subplots(figsize=(13.5, 6.4))
    y_src, y_in, y_out = 4.1, 2.0, 0.0
    _row(ax, y_src, [_x(i) for i in range(1, L + 1)], [SRC] * L, "src\n(encoder input)", SRC)
    _row(ax, y_in, ["<sos>"] + [_x(i) for i in range(1, L)], [SOS] + [DEC] * (L - 1),
         "tgt_in\n(decoder input)\n= <sos> + src[:-1]", DEC)
    _row(ax, y_out, [_x(i) for i in range(1, L + 1)], [LAB] * L, "tgt_out\n(labels)\n= src", LAB)
    for t in range(L):
        x = t * STEP
        # the prediction: position t's output is scored against the label below it
        _arrow(ax, (x, y_in - H / 2), (x, y_out + H / 2))
        # teacher forcing: the TRUE label of position t is the input of position t + 1
        if t < L - 1:
            _arrow(ax, (x + W / 2 - 0.05, y_out + H / 2), (x + STEP - W / 2 + 0.05, y_in - H / 2),
                   color=LAB, ls="--", lw=1.1)
        # cross-attention: to predict x_{t+1}, position t looks up source position t
        _arrow(ax, (x, y_in + H / 2), (x, y_src - H / 2), color=SRC, lw=1.0, ls=":")
        ax.text(x, y_out - 0.5, f"pos {t}", ha="center", va="center", fontsize=8.5, color="#555555")
    ax.text(4.5 * STEP, y_src + 0.65, "the encoder reads the whole source at once", ha="center", fontsize=10,
            color=SRC)
    ax.text(9.55, (y_in + y_src) / 2,
            "dotted: what the trained\nmodel's cross-attention\nlearns: position t reads\nsource position t",
            ha="left", va="center", fontsize=9, color=SRC)
    ax.text(9.55, (y_in + y_out) / 2 + 0.25, "solid: position t\npredicts the label\nbelow it",
            ha="left", va="center", fontsize=9, color="#333333")
    ax.text(9.55, (y_in + y_out) / 2 - 0.75, "dashed: the TRUE\ntoken is the next\ninput (teacher forcing)",
            ha="left", va="center", fontsize=9, color=LAB)
    ax.set_title("Teacher forcing on the copy task: the decoder input is the target shifted right by ONE position\n"
                 "position t sees <sos>, $x_1 \\ldots x_t$ (causal mask) and must predict $x_{t+1}$; all 10 positions "
                 "are trained in one forward pass", fontsize=11.5)
    ax.set_xlim(-3.3, 11.6)
    ax.set_ylim(-0.95, 5.1)
    ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110, facecolor="white")
    plt.close(fig)
    return path


def draw_shift_mistakes(path: Path) -> Path:
    L = 6
    seq = [_x(i) for i in range(1, L + 1)]
    panels = [
        ("one shift (correct)", ["<sos>"] + seq[:-1], seq,
         "position t: input $x_t$ ($x_0$ = <sos>), predicts $x_{t+1}$\nlearns to copy; generation starts from <sos>", LAB),
        ("no shift", seq, seq,
         "the label is the input itself: the model just\nechoes its input and cannot start generating", BAD),
        ("double shift", ["<sos>"] + seq[:-1], seq[1:] + ["<pad>"],
         "position t: input $x_t$, predicts $x_{t+2}$\nit skips a token: the copy fails", BAD),
    ]
    fig, axes = plt.subplots(1, 3, figsize=(14.5, 3.9))
    for ax, (title, inp, lab, verdict, vcolor) in zip(axes, panels):
        for t in range(L):
            x = t * STEP
            _box(ax, x, 1.5, inp[t], SOS if inp[t] == "<sos>" else DEC, fontsize=8.5 if inp[t] == "<sos>" else 10)
            _box(ax, x, 0.0, lab[t], PAD if lab[t] == "<pad>" else LAB,
                 text_color="black" if lab[t] == "<pad>" else "white", fontsize=8.5 if lab[t] == "<pad>" else 10)
            _arrow(ax, (x, 1.5 - H / 2), (x, H / 2))
        ax.text(-0.55, 1.5, "input", ha="right", va="center", fontsize=9.5, color=DEC, fontweight="bold")
        ax.text(-0.55, 0.0, "label", ha="right", va="center", fontsize=9.5, color=LAB, fontweight="bold")
        ax.text((L - 1) * STEP / 2, -0.85, verdict, ha="center", va="center", fontsize=9.5, color=vcolor)
        ax.set_title(title, fontsize=12, color=vcolor, fontweight="bold")
        ax.set_xlim(-1.6, L - 0.4)
        ax.set_ylim(-1.35, 2.05)
        ax.axis("off")
    fig.suptitle("Decoder input vs labels for the target $x_1 \\ldots x_6$ (arrow: this input position is scored on this "
                 "label)", fontsize=11.5)
    fig.tight_layout()
    fig.savefig(path, dpi=110, facecolor="white")
    plt.close(fig)
    return path


def draw(outdir: Path) -> list[Path]:
    outdir = Path(outdir)
    return [
        draw_teacher_forcing(outdir / "06_teacher_forcing.png"),
        draw_shift_mistakes(outdir / "06_shift_mistakes.png"),
    ]


if __name__ == "__main__":
    for p in draw(Path(__file__).resolve().parent):
        print(f"wrote {p}")
