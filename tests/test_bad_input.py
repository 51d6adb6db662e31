"""Bad input gives a ValueError/TypeError that names the argument, what it got and what it wants.

Never a cryptic broadcast error from deep inside PyTorch, never a NaN.
"""

import pytest
import torch
from _helpers import seeded  # noqa: F401  (autouse fixture)

from course_lib import (
    Decoder,
    DecoderLayer,
    Encoder,
    EncoderLayer,
    FeedForward,
    LearnedPositionalEmbedding,
    MultiHeadAttention,
    SinusoidalPositionalEncoding,
    TokenEmbedding,
    Transformer,
    TransformerConfig,
    TransformerEmbedding,
    TransformerEncoderModel,
    greedy_decode,
    pad_sequences,
    padding_mask,
    scaled_dot_product_attention,
    sinusoidal_positional_encoding,
)
from course_lib.training import LabelSmoothingLoss, noam_lr

D_MODEL, NUM_HEADS = 16, 4


def _x(batch: int = 2, length: int = 5, width: int = D_MODEL) -> torch.Tensor:
    return torch.randn(batch, length, width)


def _ids(batch: int = 2, length: int = 5, low: int = 2, high: int = 11) -> torch.Tensor:
    return torch.randint(low, high, (batch, length))


@pytest.fixture(scope="module")
def model() -> Transformer:
    return Transformer(TransformerConfig()).eval()


# ------------------------------------------------------------------ d_model vs num_heads


@pytest.mark.parametrize(
    "build",
    [
        lambda: MultiHeadAttention(16, 5),
        lambda: EncoderLayer(16, 5, 32),
        lambda: DecoderLayer(16, 5, 32),
        lambda: Encoder(2, 16, 5, 32),
        lambda: TransformerConfig(d_model=16, num_heads=5),
    ],
    ids=["MultiHeadAttention", "EncoderLayer", "DecoderLayer", "Encoder", "TransformerConfig"],
)
def test_d_model_not_divisible_by_num_heads(build):
    with pytest.raises(ValueError, match=r"d_model=16 is not divisible by num_heads=5"):
        build()


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(num_heads=0), r"num_heads must be >= 1, got 0"),
        (dict(src_vocab_size=0), r"src_vocab_size must be >= 1, got 0"),
        (dict(tie_embeddings="both"), r"tie_embeddings must be .*got 'both'"),
        (dict(src_vocab_size=12, tie_embeddings="all"), r"shared vocabulary.*src_vocab_size=12.*tgt_vocab_size=11"),
        (dict(dropout=1.0), r"dropout must be in \[0, 1\), got 1.0"),
        (dict(pad_id=11), r"pad_id=11 is outside the vocabulary"),
    ],
)
def test_transformer_config_rejects_bad_values(kwargs, words):
    with pytest.raises(ValueError, match=words):
        TransformerConfig(**kwargs)


def test_multi_head_attention_rejects_non_positive_sizes():
    with pytest.raises(ValueError, match=r"must be positive, got -4, 2"):
        MultiHeadAttention(-4, 2)


# ------------------------------------------------------------------ masks


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.uint8])
def test_non_boolean_mask_is_a_type_error_mentioning_bool(dtype):
    mask = torch.ones(2, 1, 5, dtype=dtype)
    with pytest.raises(TypeError, match=r"mask must have dtype torch\.bool.*got torch\.(float32|int64|uint8)"):
        MultiHeadAttention(D_MODEL, NUM_HEADS)(_x(), _x(), _x(), mask)
    with pytest.raises(TypeError, match=r"torch\.bool"):
        scaled_dot_product_attention(_x(), _x(), _x(), torch.ones(5, 5, dtype=dtype))


def test_mask_that_is_not_a_tensor():
    with pytest.raises(TypeError, match=r"mask must be a torch\.Tensor of dtype bool, got list"):
        scaled_dot_product_attention(_x(), _x(), _x(), [[True] * 5] * 5)


@pytest.mark.parametrize(
    "shape",
    [(3, 1, 5), (2, 1, 6), (2, 5), (2, 3, 5, 5), (2, 5, 6)],
    ids=["wrong-batch", "wrong-L_k", "(B, L)-without-query-axis", "3-heads-for-4", "wrong-L_k-full"],
)
def test_mask_of_the_wrong_shape(shape):
    mask = torch.ones(shape, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"mask of shape .* does not broadcast to the attention scores \(2, 4, 5, 5\)"):
        MultiHeadAttention(D_MODEL, NUM_HEADS)(_x(), _x(), _x(), mask)


def test_mask_that_would_enlarge_the_scores():
    with pytest.raises(ValueError, match=r"mask of shape \(3, 2, 5, 5\) would enlarge the scores \(2, 5, 5\)"):
        scaled_dot_product_attention(_x(), _x(), _x(), torch.ones(3, 2, 5, 5, dtype=torch.bool))


def test_layer_masks_are_checked(model):
    layer = DecoderLayer(D_MODEL, NUM_HEADS, 32)
    with pytest.raises(TypeError, match="bool"):
        layer(_x(), _x(length=7), tgt_mask=torch.ones(5, 5).tril())
    with pytest.raises(ValueError, match=r"mask of shape \(2, 1, 1, 6\)"):
        layer(_x(), _x(length=7), memory_mask=torch.ones(2, 1, 6, dtype=torch.bool))
    with pytest.raises(TypeError, match="bool"):
        model(_ids(), _ids(), src_mask=torch.ones(2, 1, 5))
    with pytest.raises(ValueError, match=r"does not broadcast"):
        model(_ids(), _ids(), src_mask=torch.ones(2, 1, 4, dtype=torch.bool))


def test_padding_mask_wants_2d_ids():
    with pytest.raises(ValueError, match=r"ids must be \(B, L\) token ids, got shape \(5,\)"):
        padding_mask(torch.ones(5), 0)


# ------------------------------------------------------------------ lengths, vocabulary


def test_sequence_longer_than_max_len():
    with pytest.raises(ValueError, match=r"sequence length 9 exceeds max_len=8"):
        SinusoidalPositionalEncoding(8, D_MODEL)(9)
    with pytest.raises(ValueError, match=r"sequence length 9 exceeds max_len=8"):
        LearnedPositionalEmbedding(8, D_MODEL)(9)
    for positional in ("sinusoidal", "learned"):
        embedding = TransformerEmbedding(11, D_MODEL, 8, positional=positional)
        with pytest.raises(ValueError, match=r"length 9 exceeds max_len=8"):
            embedding(_ids(length=9))


def test_transformer_input_longer_than_max_len(model):
    with pytest.raises(ValueError, match=r"sequence length 65 exceeds max_len=64"):
        model(_ids(length=65), _ids())
    with pytest.raises(ValueError, match=r"sequence length 70 exceeds max_len=64"):
        model(_ids(), _ids(length=70))


@pytest.mark.parametrize("bad, got", [(-1, r"from -1 to \d+"), (11, r"from \d+ to 11")], ids=["negative", "too-large"])
def test_token_ids_outside_the_vocabulary(model, bad, got):
    ids = _ids()
    ids[1, 2] = bad
    words = r"token ids must lie in \[0, 10\] \(vocab_size=11\), got values " + got
    with pytest.raises(ValueError, match=words):
        TokenEmbedding(11, D_MODEL)(ids)
    with pytest.raises(ValueError, match=words):
        model(ids, _ids())  # source
    with pytest.raises(ValueError, match=words):
        model(_ids(), ids)  # target


def test_float_token_ids():
    with pytest.raises(TypeError, match=r"token ids must be an integer tensor, got dtype torch\.float32"):
        TokenEmbedding(11, D_MODEL)(torch.ones(2, 3))


def test_sinusoidal_encoding_sizes():
    with pytest.raises(ValueError, match=r"max_len and d_model must be >= 1, got 0, 4"):
        sinusoidal_positional_encoding(0, 4)


# ------------------------------------------------------------------ batch sizes, empty input


def test_mismatched_batch_sizes_between_src_and_tgt(model):
    with pytest.raises(ValueError, match=r"src and tgt must have the same batch size, got 2 and 3"):
        model(_ids(batch=2), _ids(batch=3))
    memory = model.encode(_ids(batch=3))
    with pytest.raises(ValueError, match=r"tgt and memory must have the same batch size, got 2 and 3"):
        model.decode(_ids(batch=2), memory, None)


def test_transformer_wants_2d_ids(model):
    with pytest.raises(ValueError, match=r"src and tgt must be \(B, L\) ids, got \(5,\) and \(5,\)"):
        model(torch.full((5,), 2), torch.full((5,), 2))


@pytest.mark.parametrize("shape", [(0, 5), (2, 0)], ids=["empty-batch", "empty-sequence"])
def test_empty_input(model, shape):
    empty = torch.ones(shape, dtype=torch.long)
    with pytest.raises(ValueError, match=r"must be a non-empty \(B, L\) tensor, got shape"):
        model(empty, _ids(batch=shape[0] or 2, length=5) if shape[0] else empty)
    with pytest.raises(ValueError, match=r"is empty, shape \(0, 5, 16\)"):
        MultiHeadAttention(D_MODEL, NUM_HEADS)(_x(batch=0), _x(batch=0), _x(batch=0))
    with pytest.raises(ValueError, match=r"src must be a non-empty \(B, L_s\) tensor"):
        greedy_decode(model, torch.ones(0, 5, dtype=torch.long), 5, 1)


def test_query_key_value_batch_sizes():
    with pytest.raises(ValueError, match=r"same batch size, got 2, 3, 3"):
        MultiHeadAttention(D_MODEL, NUM_HEADS)(_x(batch=2), _x(batch=3), _x(batch=3))


def test_key_value_length_mismatch():
    with pytest.raises(ValueError, match=r"key and value must have the same length, got 5 and 6"):
        MultiHeadAttention(D_MODEL, NUM_HEADS)(_x(), _x(), _x(length=6))
    with pytest.raises(ValueError, match=r"key and value must have the same length L_k, got key \(2, 5, 16\)"):
        scaled_dot_product_attention(_x(), _x(), _x(length=6))
    with pytest.raises(ValueError, match=r"query and key must share their last dim d_k"):
        scaled_dot_product_attention(_x(), _x(width=8), _x(width=8))


# ------------------------------------------------------------------ wrong d_model of the input


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-LN", "pre-LN"])
def test_wrong_input_width(norm_first):
    """Pre-LN layers meet LayerNorm first: still our message, not LayerNorm's."""
    words = r"must be \(B, L, d_model=16\), got \(2, 5, 8\)"
    with pytest.raises(ValueError, match=words):
        MultiHeadAttention(D_MODEL, NUM_HEADS)(_x(width=8), _x(width=8), _x(width=8))
    with pytest.raises(ValueError, match="EncoderLayer: x " + words):
        EncoderLayer(D_MODEL, NUM_HEADS, 32, norm_first=norm_first)(_x(width=8))
    with pytest.raises(ValueError, match="EncoderLayer: x " + words):
        Encoder(2, D_MODEL, NUM_HEADS, 32, norm_first=norm_first)(_x(width=8))
    with pytest.raises(ValueError, match="DecoderLayer: x " + words):
        DecoderLayer(D_MODEL, NUM_HEADS, 32, norm_first=norm_first)(_x(width=8), _x())
    with pytest.raises(ValueError, match="DecoderLayer: memory " + words):
        Decoder(1, D_MODEL, NUM_HEADS, 32, norm_first=norm_first)(_x(), _x(width=8))
    with pytest.raises(ValueError, match=r"FeedForward: x must be \(\.\.\., d_model=16\), got \(2, 5, 8\)"):
        FeedForward(D_MODEL, 32)(_x(width=8))


def test_missing_batch_axis():
    with pytest.raises(ValueError, match=r"query must be \(B, L, d_model=16\), got \(5, 16\)"):
        x = torch.randn(5, D_MODEL)
        MultiHeadAttention(D_MODEL, NUM_HEADS)(x, x, x)
    with pytest.raises(ValueError, match=r"EncoderLayer: x must be \(B, L, d_model=16\), got \(5, 16\)"):
        EncoderLayer(D_MODEL, NUM_HEADS, 32)(torch.randn(5, D_MODEL))


# ------------------------------------------------------------------ other constructors and helpers


def test_loss_rejects_bad_labels_and_shapes():
    loss_fn = LabelSmoothingLoss(11, 0)
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 10\] \(vocab_size=11\), got values from 3 to 11"):
        loss_fn(torch.randn(2, 5, 11), torch.tensor([[3] * 5, [3, 3, 3, 3, 11]]))
    with pytest.raises(ValueError, match=r"got values from -1"):
        loss_fn(torch.randn(2, 5, 11), torch.full((2, 5), -1))
    with pytest.raises(ValueError, match=r"logits must be labels\.shape \+ \(V=11,\), got logits \(2, 5, 11\)"):
        loss_fn(torch.randn(2, 5, 11), torch.full((2, 4), 3))
    with pytest.raises(ValueError, match=r"every label is padding"):
        loss_fn(torch.randn(2, 5, 11), torch.zeros(2, 5, dtype=torch.long))
    with pytest.raises(ValueError, match=r"smoothing must be in \[0, 1\), got 1.0"):
        LabelSmoothingLoss(11, 0, smoothing=1.0)


def test_other_helpers():
    with pytest.raises(ValueError, match=r"warmup must be >= 1, got 0"):
        noam_lr(1, 512, 0)
    with pytest.raises(ValueError, match=r"a sequence has 3 ids, longer than length=2"):
        pad_sequences([[1, 2, 3]], 0, length=2)
    with pytest.raises(ValueError, match=r"empty list of sequences"):
        pad_sequences([], 0)
    with pytest.raises(ValueError, match=r"activation must be one of \['gelu', 'gelu_tanh', 'relu'\], got 'tanh'"):
        FeedForward(16, 32, activation="tanh")
    with pytest.raises(ValueError, match=r"attention_mask must have the shape of ids \(2, 5\), got \(2, 4\)"):
        TransformerEncoderModel(TransformerConfig())(_ids(), torch.ones(2, 4))


def test_no_nan_anywhere_for_valid_but_extreme_input(model):
    """Valid extremes (all padding, length 1, huge activations) stay finite."""
    assert torch.isfinite(model(torch.zeros(2, 4, dtype=torch.long), _ids(length=1))).all()
    out = MultiHeadAttention(D_MODEL, NUM_HEADS)(_x() * 1e4, _x() * 1e4, _x())
    assert torch.isfinite(out).all()
