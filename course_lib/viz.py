"""Pictures used across the lessons: attention heatmaps, masks, static attention views, curves.

Every function draws on a matplotlib ``Axes`` (a new figure when ``ax`` is None) and returns it,
with a title, labelled axes and readable tick labels. Pass plain tensors; they are detached and
moved to the CPU here.
"""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.axes import Axes
from matplotlib.figure import Figure

__all__ = [
    "DIVERGING_CMAP",
    "plot_attention",
    "plot_attention_heads",
    "plot_mask",
    "plot_positional_encoding",
    "plot_loss",
    "plot_head_view_static",
    "plot_model_view_static",
    "plot_neuron_view_static",
]


# One diverging colour map for signed values across the whole course, always with a colorbar:
# negative = blue, 0 = white, positive = red. (Attention weights, which are >= 0, use "viridis".)
DIVERGING_CMAP = "RdBu_r"


def _np(x: torch.Tensor | np.ndarray) -> np.ndarray:
    return x.detach().float().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def _new_ax(ax: Axes | None, size: tuple[float, float]) -> Axes:
    if ax is None:
        _, ax = plt.subplots(figsize=size)
    return ax


def plot_attention(
    weights: torch.Tensor,
    query_tokens: Sequence[str] | None = None,
    key_tokens: Sequence[str] | None = None,
    title: str = "Attention weights",
    ax: Axes | None = None,
    annotate: bool = False,
    colorbar: bool = True,
    cmap: str = "viridis",
    vmax: float | None = None,
) -> Axes:
    """Heatmap of one attention matrix ``weights (L_q, L_k)``: row = query, column = key.

    The colours run from 0 to ``vmax``, by default this matrix's largest weight (pass a common
    ``vmax`` to compare several matrices on one scale).
    """
    w = _np(weights)
    if w.ndim != 2:
        raise ValueError(f"plot_attention: weights must be (L_q, L_k), got shape {w.shape}")
    ax = _new_ax(ax, (0.5 * w.shape[1] + 2.5, 0.45 * w.shape[0] + 1.8))
    top = max(float(w.max()), 1e-9) if vmax is None else vmax
    im = ax.imshow(w, cmap=cmap, vmin=0.0, vmax=top, aspect="auto")
    ax.set_xticks(range(w.shape[1]), labels=list(key_tokens) if key_tokens is not None else range(w.shape[1]),
                  rotation=60 if key_tokens is not None else 0, ha="right" if key_tokens is not None else "center")
    ax.set_yticks(range(w.shape[0]), labels=list(query_tokens) if query_tokens is not None else range(w.shape[0]))
    ax.set_xlabel("key (attended to)")
    ax.set_ylabel("query (attending)")
    ax.set_title(title)
    if annotate:
        for i in range(w.shape[0]):
            for j in range(w.shape[1]):
                ax.text(j, i, f"{w[i, j]:.2f}", ha="center", va="center", fontsize=7,
                        color="white" if w[i, j] < 0.6 * top else "black")
    if colorbar:
        ax.figure.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label="weight")
    return ax


def plot_attention_heads(
    weights: torch.Tensor,
    query_tokens: Sequence[str] | None = None,
    key_tokens: Sequence[str] | None = None,
    title: str = "Attention per head",
    ncols: int = 4,
    vmax: float = 1.0,
) -> Figure:
    """One heatmap per head: ``weights (num_heads, L_q, L_k)``.

    Every panel uses the same colour scale, 0 to ``vmax`` (1 = all of a query's weight on one key),
    shown by one colorbar, so a weak head looks weak.
    """
    w = _np(weights)
    if w.ndim != 3:
        raise ValueError(f"plot_attention_heads: weights must be (num_heads, L_q, L_k), got shape {w.shape}")
    h = w.shape[0]
    ncols = min(ncols, h)
    nrows = int(np.ceil(h / ncols))
    side = 0.32 * max(w.shape[1:]) + 1.2
    fig, axes = plt.subplots(nrows, ncols, figsize=(side * ncols + 1.0, side * nrows), squeeze=False,
                             layout="constrained")
    for i, ax in enumerate(axes.flat):
        if i >= h:
            ax.axis("off")
            continue
        plot_attention(w[i], query_tokens, key_tokens, title=f"head {i}", ax=ax, colorbar=False,
                       vmax=vmax)
        if i % ncols:
            ax.set_ylabel("")
        if i < h - ncols:
            ax.set_xlabel("")
    mappable = plt.cm.ScalarMappable(norm=plt.Normalize(0.0, vmax), cmap="viridis")
    fig.colorbar(mappable, ax=axes, shrink=0.6, label="attention weight (same scale in every panel)")
    fig.suptitle(title)
    return fig


def plot_mask(
    mask: torch.Tensor,
    query_tokens: Sequence[str] | None = None,
    key_tokens: Sequence[str] | None = None,
    title: str = "Mask (True = may attend)",
    ax: Axes | None = None,
) -> Axes:
    """Boolean mask ``(L_q, L_k)``: dark = may attend, light = hidden."""
    m = _np(mask).astype(float)
    if m.ndim != 2:
        raise ValueError(f"plot_mask: mask must be (L_q, L_k), got shape {m.shape}; select one batch row first")
    ax = _new_ax(ax, (0.45 * m.shape[1] + 2.0, 0.45 * m.shape[0] + 1.5))
    ax.imshow(m, cmap="Blues", vmin=-0.2, vmax=1.0, aspect="auto")
    for i in range(m.shape[0]):
        for j in range(m.shape[1]):
            ax.text(j, i, "✓" if m[i, j] else "·", ha="center", va="center",
                    color="white" if m[i, j] else "grey", fontsize=9)
    ax.set_xticks(range(m.shape[1]), labels=list(key_tokens) if key_tokens is not None else range(m.shape[1]),
                  rotation=60 if key_tokens is not None else 0, ha="right" if key_tokens is not None else "center")
    ax.set_yticks(range(m.shape[0]), labels=list(query_tokens) if query_tokens is not None else range(m.shape[0]))
    ax.set_xlabel("key position")
    ax.set_ylabel("query position")
    ax.set_title(title)
    return ax


def plot_positional_encoding(pe: torch.Tensor, title: str = "Sinusoidal positional encoding", ax: Axes | None = None) -> Axes:
    """Heatmap of ``pe (max_len, d_model)``: rows = positions, columns = dimensions."""
    p = _np(pe)
    ax = _new_ax(ax, (9, 4.5))
    im = ax.imshow(p, cmap=DIVERGING_CMAP, vmin=-1, vmax=1, aspect="auto")
    ax.set_xlabel("embedding dimension (even = sin, odd = cos)")
    ax.set_ylabel("position")
    ax.set_title(title)
    ax.figure.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label="value")
    return ax


def plot_loss(history: Sequence[float], title: str = "Training loss", ax: Axes | None = None, log: bool = True) -> Axes:
    """Loss per step (log scale by default) with a moving average."""
    h = np.asarray(history, dtype=float)
    ax = _new_ax(ax, (7, 3.8))
    ax.plot(h, lw=0.8, alpha=0.5, label="per step")
    if len(h) >= 20:
        k = max(len(h) // 50, 5)
        smooth = np.convolve(h, np.ones(k) / k, mode="valid")
        ax.plot(np.arange(k - 1, len(h)), smooth, lw=2, label=f"moving average ({k} steps)")
    if log:
        ax.set_yscale("log")
    ax.set_xlabel("training step")
    ax.set_ylabel("loss")
    ax.set_title(title)
    ax.legend()
    ax.grid(alpha=0.3)
    return ax


def plot_head_view_static(
    weights: torch.Tensor,
    tokens: Sequence[str],
    heads: Sequence[int] | None = None,
    title: str = "Head view",
    ax: Axes | None = None,
    min_weight: float = 0.05,
) -> Axes:
    """A still image of bertviz's head view for one layer: ``weights (num_heads, L, L)``.

    Tokens are listed twice (left: query, right: key); each line joins a query to a key, its
    opacity is the attention weight, its colour the head. Weights below ``min_weight`` are not drawn.
    """
    w = _np(weights)
    if w.ndim != 3 or w.shape[1] != w.shape[2] or w.shape[1] != len(tokens):
        raise ValueError(f"plot_head_view_static: weights must be (num_heads, L, L) with L = len(tokens)={len(tokens)}, got {w.shape}")
    heads = list(range(w.shape[0])) if heads is None else list(heads)
    L = len(tokens)
    ax = _new_ax(ax, (4.5, 0.38 * L + 1.2))
    colors = plt.get_cmap("tab20")(np.linspace(0, 1, 20))
    for h in heads:
        for i in range(L):
            for j in range(L):
                if w[h, i, j] >= min_weight:
                    ax.plot([0, 1], [i, j], color=colors[h % 20], alpha=float(min(1.0, w[h, i, j])) * 0.9,
                            lw=1.5)
    for i, tok in enumerate(tokens):
        ax.text(-0.04, i, tok, ha="right", va="center", fontsize=10)
        ax.text(1.04, i, tok, ha="left", va="center", fontsize=10)
    ax.set_xlim(-0.6, 1.6)
    ax.set_ylim(L - 0.5, -0.5)
    ax.axis("off")
    label = f"heads {heads}" if len(heads) <= 4 else f"{len(heads)} heads"
    ax.set_title(f"{title} ({label})\nleft: query, right: key; opacity = weight", fontsize=10)
    return ax


def plot_model_view_static(
    attentions: Sequence[torch.Tensor],
    tokens: Sequence[str],
    title: str = "Model view: every layer (rows) and head (columns)",
) -> Figure:
    """A still image of bertviz's model view: a grid of small heatmaps, ``attentions[layer] (num_heads, L, L)``
    (batch row already selected). Every panel uses the same scale, 0 to 1, shown by one colorbar."""
    layers = [_np(a) for a in attentions]
    if not layers or any(a.ndim != 3 for a in layers):
        raise ValueError("plot_model_view_static: pass one (num_heads, L, L) tensor per layer (select the batch row)")
    n_layers, n_heads = len(layers), layers[0].shape[0]
    width, height = 1.15 * n_heads + 2, 1.15 * n_layers + 1.2  # inches
    fig = plt.figure(figsize=(width, height))
    # Fixed margins in inches, not layout="constrained", which took 3 of 5 seconds for MiniLM's 72
    # panels: the title above, the layer labels on the left, the colorbar on the right.
    grid = fig.add_gridspec(n_layers, n_heads, left=0.5 / width, right=1 - 1.5 / width,
                            top=1 - 0.9 / height, bottom=0.1 / height, wspace=0.08, hspace=0.08)
    for l, a in enumerate(layers):
        for h in range(n_heads):
            ax = fig.add_subplot(grid[l, h])
            im = ax.imshow(a[h], cmap="viridis", vmin=0, vmax=1)
            ax.set_xticks([])
            ax.set_yticks([])
            if l == 0:
                ax.set_title(f"head {h}", fontsize=8)
            if h == 0:
                ax.set_ylabel(f"layer {l}", fontsize=8)
    colorbar = fig.add_axes((1 - 1.2 / width, 0.15, 0.2 / width, 0.7))
    fig.colorbar(im, cax=colorbar, label="attention weight (same scale in every panel)")
    fig.suptitle(f"{title}\ntokens: {' '.join(tokens)}", fontsize=10)
    return fig


def plot_neuron_view_static(
    queries: torch.Tensor,
    keys: torch.Tensor,
    tokens: Sequence[str],
    query_index: int,
    title: str = "Neuron view",
) -> Figure:
    """A still image of bertviz's neuron view for one head and one query token.

    ``queries`` and ``keys`` are one head's ``(L, head_dim)`` vectors; ``query_index`` picks the
    query. Columns, left to right: the query q (one row), the keys k (one row per token), the
    products q x k elementwise, the scores q . k / sqrt(head_dim) and their softmax, the weights.
    Signed values use the course's diverging map (red = positive, blue = negative) with colorbars.
    """
    q_all, k = _np(queries), _np(keys)
    if q_all.ndim != 2 or k.ndim != 2 or q_all.shape[1] != k.shape[1] or k.shape[0] != len(tokens):
        raise ValueError(f"plot_neuron_view_static: queries (L_q, head_dim) and keys (L, head_dim) with "
                         f"L = len(tokens)={len(tokens)}, got {q_all.shape} and {k.shape}")
    if not 0 <= query_index < q_all.shape[0]:
        raise ValueError(f"plot_neuron_view_static: query_index {query_index} is not a row of queries "
                         f"{q_all.shape}")
    q = q_all[query_index]
    L, d = k.shape
    product = q[None, :] * k  # (L, head_dim)
    scores = product.sum(-1) / np.sqrt(d)  # (L,)
    weights = np.exp(scores - scores.max())
    weights = weights / weights.sum()
    fig = plt.figure(figsize=(15, 0.42 * L + 3.2), layout="constrained")
    grid = fig.add_gridspec(2, 4, height_ratios=[1, L], width_ratios=[d, d, 3.5, 3.5])
    vec_max = float(max(np.abs(q).max(), np.abs(k).max()))
    prod_max = float(np.abs(product).max())
    ax_q = fig.add_subplot(grid[0, 0])
    ax_q.imshow(q[None, :], cmap=DIVERGING_CMAP, vmin=-vec_max, vmax=vec_max, aspect="auto")
    ax_q.set_yticks([0], labels=[tokens[query_index]])
    ax_q.set_xticks([])
    ax_q.set_title(f"query q of '{tokens[query_index]}' ({d} numbers)")
    ax_k = fig.add_subplot(grid[1, 0])
    im_k = ax_k.imshow(k, cmap=DIVERGING_CMAP, vmin=-vec_max, vmax=vec_max, aspect="auto")
    ax_k.set_title("keys k (one row per token)")
    ax_p = fig.add_subplot(grid[1, 1])
    im_p = ax_p.imshow(product, cmap=DIVERGING_CMAP, vmin=-prod_max, vmax=prod_max, aspect="auto")
    ax_p.set_title("q × k, elementwise")
    for ax in (ax_k, ax_p):
        ax.set_yticks(range(L), labels=list(tokens))
        ax.set_xlabel(f"dimension (0 ... {d - 1})")
    ax_k.set_ylabel("key token")
    fig.colorbar(im_k, ax=[ax_q, ax_k], location="bottom", shrink=0.8, label="value of q and k")
    fig.colorbar(im_p, ax=ax_p, location="bottom", shrink=0.8, label="q_d × k_d")
    for col, (values, name, cmap, lims) in enumerate((
            (scores, f"q · k / √{d}", DIVERGING_CMAP, (-np.abs(scores).max(), np.abs(scores).max())),
            (weights, "softmax", "viridis", (0.0, 1.0)))):
        ax = fig.add_subplot(grid[1, 2 + col])
        ax.imshow(values[:, None], cmap=cmap, vmin=lims[0], vmax=lims[1], aspect="auto")
        for i, value in enumerate(values):
            ax.text(0, i, f"{value:.2f}", ha="center", va="center", fontsize=9,
                    bbox={"facecolor": "white", "alpha": 0.7, "pad": 1, "lw": 0})
        ax.set_yticks(range(L), labels=list(tokens))
        ax.set_xticks([])
        ax.set_title(name)
    fig.suptitle(title)
    return fig
