"""Shape tracing (loguru) and the plotting helpers."""

import io
import re
import subprocess
import sys

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from _helpers import seeded  # noqa: F401, E402  (autouse fixture)
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from course_lib import (  # noqa: E402
    MultiHeadAttention,
    Transformer,
    TransformerConfig,
    causal_mask,
    disable_shape_tracing,
    enable_shape_tracing,
    shape_tracing,
    sinusoidal_positional_encoding,
)
from course_lib import viz  # noqa: E402
from course_lib.tracing import is_tracing  # noqa: E402


@pytest.fixture(autouse=True)
def _tracing_off_and_figures_closed():
    disable_shape_tracing()
    yield
    disable_shape_tracing()
    plt.close("all")


# --------------------------------------------------------------------------------------------
# Tracing
# --------------------------------------------------------------------------------------------


def test_tracing_is_off_by_default():
    """A fresh interpreter: importing course_lib and running a model prints nothing."""
    code = (
        "import torch, course_lib\n"
        "assert not course_lib.tracing.is_tracing()\n"
        "x = torch.randn(2, 7, 32)\n"
        "course_lib.MultiHeadAttention(32, 4)(x, x, x)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "MultiHeadAttention" not in result.stdout + result.stderr


def test_tracing_logs_deterministic_shape_lines_and_stops_when_disabled():
    sink = io.StringIO()
    enable_shape_tracing(sink=sink)
    assert is_tracing()
    x = torch.randn(2, 7, 32)
    MultiHeadAttention(32, 4)(x, x, x)
    lines = sink.getvalue().splitlines()
    assert "MultiHeadAttention | q after split_heads: (2, 4, 7, 8)" in lines
    assert "MultiHeadAttention | attention weights: (2, 4, 7, 7)" in lines
    assert "MultiHeadAttention | output: (2, 7, 32)" in lines
    for line in lines:  # nothing machine- or time-dependent
        assert re.fullmatch(r"\w+ \| [\w ]+: \([\d, ]*\)", line), line
        assert not re.search(r"\d{2}:\d{2}:\d{2}|\d{4}-\d{2}-\d{2}", line)
    disable_shape_tracing()
    assert not is_tracing()
    n = len(sink.getvalue())
    MultiHeadAttention(32, 4)(x, x, x)
    assert len(sink.getvalue()) == n


def test_tracing_context_manager_covers_the_whole_model():
    sink = io.StringIO()
    model = Transformer(TransformerConfig()).eval()
    with shape_tracing(sink=sink):
        model(torch.randint(2, 11, (2, 6)), torch.randint(2, 11, (2, 5)))
    assert not is_tracing()
    text = sink.getvalue()
    for expected in ("TransformerEmbedding | embeddings: (2, 6, 64)", "EncoderLayer | output: (2, 6, 64)",
                     "Transformer | memory: (2, 6, 64)", "DecoderLayer | output: (2, 5, 64)",
                     "Transformer | logits: (2, 5, 11)"):
        assert expected in text.splitlines()


# --------------------------------------------------------------------------------------------
# Plots: title and axis labels are always set
# --------------------------------------------------------------------------------------------


def _labelled(ax: Axes) -> None:
    assert ax.get_title() and ax.get_xlabel() and ax.get_ylabel()


def test_plot_attention_with_tokens():
    weights = torch.softmax(torch.randn(3, 4), -1)
    ax = viz.plot_attention(weights, ["a", "b", "c"], ["w", "x", "y", "z"], title="demo", annotate=True)
    assert isinstance(ax, Axes)
    _labelled(ax)
    assert ax.get_title() == "demo"
    assert [t.get_text() for t in ax.get_xticklabels()] == ["w", "x", "y", "z"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["a", "b", "c"]
    with pytest.raises(ValueError, match=r"weights must be \(L_q, L_k\)"):
        viz.plot_attention(torch.rand(2, 3, 4))


def test_plot_attention_heads_returns_a_figure_with_one_panel_per_head():
    fig = viz.plot_attention_heads(torch.softmax(torch.randn(6, 4, 4), -1), list("abcd"), list("abcd"), ncols=4)
    assert isinstance(fig, Figure)
    assert fig._suptitle is not None and fig._suptitle.get_text() == "Attention per head"
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert titles == [f"head {i}" for i in range(6)]
    # One colour scale, 0 to 1, for every head (a weak head must look weak), shown by one colorbar.
    heads = [ax for ax in fig.axes if ax.get_title().startswith("head")]
    assert {ax.images[0].get_clim() for ax in heads} == {(0.0, 1.0)}
    assert "same scale" in fig.axes[-1].get_ylabel()


def test_plot_attention_keeps_its_own_scale_unless_told():
    weights = torch.tensor([[0.2, 0.1], [0.05, 0.15]])
    assert viz.plot_attention(weights).images[0].get_clim() == pytest.approx((0.0, 0.2))
    assert viz.plot_attention(weights, vmax=1.0).images[0].get_clim() == (0.0, 1.0)


def test_plot_neuron_view_static_shows_query_keys_products_scores_and_weights():
    tokens = ["[CLS]", "time", "flies", "[SEP]"]
    q, k = torch.randn(4, 6), torch.randn(4, 6)
    fig = viz.plot_neuron_view_static(q, k, tokens, query_index=2, title="demo")
    titles = [ax.get_title() for ax in fig.axes]
    assert "query q of 'flies' (6 numbers)" in titles and "q × k, elementwise" in titles
    assert "softmax" in titles and any(t.startswith("q · k") for t in titles)
    product = next(ax for ax in fig.axes if ax.get_title() == "q × k, elementwise")
    assert product.images[0].get_array().shape == (4, 6)
    softmax = next(ax for ax in fig.axes if ax.get_title() == "softmax")
    expected = torch.softmax(k @ q[2] / 6 ** 0.5, -1)
    shown = [float(t.get_text()) for t in softmax.texts]
    assert shown == pytest.approx(expected.tolist(), abs=0.006)  # printed with 2 decimals
    with pytest.raises(ValueError, match=r"L = len\(tokens\)=3"):
        viz.plot_neuron_view_static(q, k, tokens[:3], query_index=0)
    with pytest.raises(ValueError, match="query_index 4"):
        viz.plot_neuron_view_static(q, k, tokens, query_index=4)


def test_plot_mask():
    ax = viz.plot_mask(causal_mask(4), list("abcd"), list("abcd"))
    _labelled(ax)
    assert "True = may attend" in ax.get_title()
    with pytest.raises(ValueError, match=r"select one batch row first"):
        viz.plot_mask(torch.ones(2, 3, 3, dtype=torch.bool))


def test_plot_positional_encoding_and_loss():
    ax = viz.plot_positional_encoding(sinusoidal_positional_encoding(20, 16))
    _labelled(ax)
    ax = viz.plot_loss([3.0 / (i + 1) for i in range(40)])
    _labelled(ax)
    assert ax.get_yscale() == "log"
    assert len(ax.get_lines()) == 2  # per step and moving average


def test_static_head_and_model_views():
    tokens = ["[CLS]", "the", "cat", "[SEP]"]
    ax = viz.plot_head_view_static(torch.softmax(torch.randn(3, 4, 4), -1), tokens, heads=[0, 2])
    assert isinstance(ax, Axes) and "Head view" in ax.get_title()
    assert {t.get_text() for t in ax.texts} == set(tokens)
    fig = viz.plot_model_view_static([torch.softmax(torch.randn(3, 4, 4), -1) for _ in range(2)], tokens)
    assert isinstance(fig, Figure) and len(fig.axes) == 6 + 1  # 2 layers x 3 heads, one colorbar
    panels = [ax for ax in fig.axes if ax.images]
    assert all(ax.images[0].get_clim() == (0, 1) for ax in panels[:6])  # one scale for every panel
    assert "same scale" in fig.axes[-1].get_ylabel()
    assert "layer 1" in [ax.get_ylabel() for ax in fig.axes]
    with pytest.raises(ValueError, match=r"L = len\(tokens\)=3"):
        viz.plot_head_view_static(torch.rand(3, 4, 4), tokens[:3])
