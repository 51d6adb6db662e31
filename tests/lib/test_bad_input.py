"""Bad input gives a ValueError/TypeError that names the argument, what it got and what it wants.

Never a cryptic broadcast error from deep inside PyTorch, never a NaN.
"""

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaForCausalLM
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


# ------------------------------------------------------------------ Part II: GPT, Llama-style, RoPE
# Issue 25's cases: each is refused with a message that names what to fix, or works correctly.

import math  # noqa: E402

import numpy as np  # noqa: E402

from course_lib.gpt import GPT, GPTConfig, hf_gpt2_config, lm_loss, load_into_hf_gpt2, from_hf_gpt2  # noqa: E402
from course_lib.llama import from_hf_llama, hf_llama_config, load_into_hf_llama  # noqa: E402
from course_lib.lm_training import LMRecipe  # noqa: E402
from course_lib.modern import RMSNorm  # noqa: E402
from course_lib.rope import RotaryEmbedding, rotary_frequencies  # noqa: E402

TINY = dict(vocab_size=10, max_len=8, d_model=16, num_heads=2, num_layers=1)


@pytest.fixture(scope="module")
def gpt() -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(**TINY)).eval()


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64])
def test_every_integer_dtype_of_ids_gives_the_int64_result(gpt, model, dtype):
    """nn.Embedding takes only int64 and int32; the models accept every integer dtype (the values are
    checked, then converted), with the same logits as int64 ids."""
    ids = torch.tensor([[3, 1, 4, 1, 5], [9, 2, 6, 5, 3]])
    with torch.no_grad():
        torch.testing.assert_close(gpt(ids.to(dtype)), gpt(ids), atol=0, rtol=0)
        torch.testing.assert_close(model(ids.to(dtype), ids.to(dtype)), model(ids, ids), atol=0, rtol=0)
    assert TokenEmbedding(11, D_MODEL)(ids.to(dtype)).shape == (2, 5, D_MODEL)
    out = gpt.generate(ids.to(dtype), 3, greedy=True)
    assert out.dtype == torch.int64 and torch.equal(out, gpt.generate(ids, 3, greedy=True))
    cache = gpt.start_cache(2)
    torch.testing.assert_close(gpt.step(ids[:, 0].to(dtype), cache), gpt(ids[:, :1])[:, 0], atol=1e-6, rtol=0)


def test_uint8_ids_beyond_the_vocabulary_are_still_refused(gpt):
    with pytest.raises(ValueError, match=r"token ids must lie in \[0, 9\] \(vocab_size=10\), got values from 0 to 200"):
        gpt(torch.tensor([[0, 200]], dtype=torch.uint8))


@pytest.mark.parametrize(
    "ids, fix",
    [([[1, 2, 3]], r"got list; convert them with torch\.tensor\(ids\)"),
     (np.array([[1, 2, 3]]), r"got ndarray; convert them with torch\.from_numpy\(ids\)"),
     (np.array([[1, 2, 3]], dtype=np.int32), r"got ndarray; convert them with torch\.from_numpy")],
    ids=["list", "numpy-int64", "numpy-int32"],
)
def test_ids_that_are_not_a_tensor_say_a_torch_tensor_is_needed(gpt, model, ids, fix):
    words = r"must be a torch tensor \(B, L\) of integers, " + fix
    with pytest.raises(TypeError, match="GPT: token ids " + words):
        gpt(ids)
    with pytest.raises(TypeError, match="GPT.generate: token ids " + words):
        gpt.generate(ids, 2)
    with pytest.raises(TypeError, match="TokenEmbedding: token ids " + words):
        TokenEmbedding(11, D_MODEL)(ids)
    with pytest.raises(TypeError, match="Transformer: src " + words):
        model(ids, torch.ones(1, 3, dtype=torch.long))
    with pytest.raises(TypeError, match="Transformer: tgt " + words):
        model(torch.ones(1, 3, dtype=torch.long), ids)
    with pytest.raises(TypeError, match="Transformer.encode: src " + words):
        model.encode(ids)
    with pytest.raises(TypeError, match="TransformerEncoderModel: ids " + words):
        TransformerEncoderModel(TransformerConfig())(ids)
    with pytest.raises(TypeError, match=r"lm_loss: targets must be a torch tensor"):
        lm_loss(torch.randn(1, 3, 5), ids)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bool, torch.complex64])
def test_ids_of_a_non_integer_dtype_are_refused_naming_it(gpt, dtype):
    with pytest.raises(TypeError, match=rf"token ids must be an integer tensor, got dtype {dtype}"):
        gpt(torch.ones(1, 3, dtype=dtype))


def test_sizes_computed_with_a_slash_become_the_int_they_equal():
    """4 * 48 / 3 is 64.0 and 6 / 3 is 2.0: the configs keep the int, and the model is the one
    built from ints (same parameter shapes, same logits from the same seed)."""
    sizes = dict(vocab_size=20, max_len=16, d_model=48, num_heads=6, num_layers=2)
    floats = GPTConfig.llama_style(**{**sizes, "d_model": 48.0, "num_layers": 4 / 2}, d_ff=4 * 48 / 3,
                                   num_kv_heads=6 / 3)
    ints = GPTConfig.llama_style(**sizes, d_ff=64, num_kv_heads=2)
    assert floats == ints and all(type(getattr(floats, f)) is int
                                  for f in ("d_model", "num_layers", "d_ff", "num_kv_heads"))
    torch.manual_seed(0)
    a = GPT(floats).eval()
    torch.manual_seed(0)
    b = GPT(ints).eval()
    ids = torch.randint(0, 20, (2, 16))
    with torch.no_grad():
        torch.testing.assert_close(a(ids), b(ids), atol=0, rtol=0)
    assert GPTConfig(d_model=np.int64(48), num_heads=3).d_model == 48  # NumPy ints too
    config = TransformerConfig(d_ff=256 / 2, num_encoder_layers=2.0, max_len=64.0)
    assert (config.d_ff, config.num_encoder_layers, config.max_len) == (128, 2, 64)
    Transformer(config)  # builds
    assert MultiHeadAttention(16.0, 4, num_kv_heads=2.0).k_proj.out_features == 8
    assert RotaryEmbedding(8.0, 4.0).cos.shape == (4, 8)


@pytest.mark.parametrize(
    "build, words",
    [(lambda: GPTConfig(d_ff=42.5), r"GPTConfig: d_ff must be a whole number, got 42\.5; a size computed with '/'"),
     (lambda: GPTConfig(d_model=40, num_heads=2.5), r"GPTConfig: num_heads must be a whole number, got 2\.5"),
     (lambda: GPTConfig.llama_style(num_kv_heads=4 / 3), r"GPTConfig: num_kv_heads must be a whole number"),
     (lambda: GPTConfig(vocab_size=83.5), r"GPTConfig: vocab_size must be a whole number, got 83\.5"),
     (lambda: GPTConfig(max_len=float("inf")), r"GPTConfig: max_len must be a whole number, got inf"),
     (lambda: GPTConfig(num_layers=float("nan")), r"GPTConfig: num_layers must be a whole number, got nan"),
     (lambda: TransformerConfig(d_ff=127.5), r"TransformerConfig: d_ff must be a whole number, got 127\.5"),
     (lambda: TransformerConfig(num_decoder_layers=1.5), r"TransformerConfig: num_decoder_layers must be a whole"),
     (lambda: TransformerConfig(max_len=64.5), r"TransformerConfig: max_len must be a whole number"),
     (lambda: MultiHeadAttention(16, 4, num_kv_heads=1.5), r"MultiHeadAttention: num_kv_heads must be a whole"),
     (lambda: RotaryEmbedding(8, 4.5), r"RotaryEmbedding: max_len must be a whole number"),
     (lambda: LMRecipe(batch_size=12.5), r"LMRecipe: batch_size must be a whole number")],
    ids=["d_ff", "num_heads", "num_kv_heads", "vocab_size", "max_len-inf", "num_layers-nan", "T-d_ff",
         "T-decoder-layers", "T-max_len", "MHA-kv", "RoPE-max_len", "LMRecipe"],
)
def test_a_fractional_size_is_refused_naming_the_field(build, words):
    with pytest.raises(ValueError, match=words):
        build()


@pytest.mark.parametrize(
    "kwargs, error, words",
    [(dict(num_layers=True), TypeError, r"num_layers must be a whole number, got True \(bool\)"),
     (dict(vocab_size="83"), TypeError, r"vocab_size must be a whole number, got '83' \(str\)"),
     (dict(d_ff=0), ValueError, r"d_ff must be >= 1, got 0"),
     (dict(num_kv_heads=0), ValueError, r"num_kv_heads must be >= 1, got 0"),
     (dict(bias="no"), TypeError, r"bias must be True or False, got 'no'"),
     (dict(tie_embeddings=1), TypeError, r"tie_embeddings must be True or False, got 1"),
     (dict(layer_norm_eps=-1e-5), ValueError, r"layer_norm_eps must be a finite number > 0, got -1e-05"),
     (dict(dropout="0.1"), ValueError, r"dropout must be in \[0, 1\), got 0.1"),
     (dict(norm="RMSNorm"), ValueError, r"norm must be 'layernorm' or 'rmsnorm', got 'RMSNorm'"),
     (dict(positional="rotary"), ValueError, r"positional must be one of .*got 'rotary'"),
     (dict(activation="silu"), ValueError, r"activation must be .*'swiglu', got 'silu'")],
)
def test_gpt_config_refuses_other_bad_fields(kwargs, error, words):
    with pytest.raises(error, match="GPTConfig: " + words):
        GPTConfig(**kwargs)


@pytest.mark.parametrize("base", [0, -10000.0, float("nan"), float("inf"), "10000"])
def test_rope_base_that_would_give_nan_or_meaningless_angles_is_refused(base):
    """rope_base <= 0 gave NaN logits without a word; inf turns every plane but the first by 0."""
    with pytest.raises(ValueError, match=r"GPTConfig: rope_base must be a finite number > 0"):
        GPTConfig.llama_style(**TINY, rope_base=base)
    with pytest.raises(ValueError, match=r"rotary_frequencies: base must be a finite number > 0 .*got"):
        RotaryEmbedding(8, 4, base=base)
    with pytest.raises(ValueError, match=r"base must be a finite number > 0"):
        rotary_frequencies(8, base)


def test_small_positive_rope_base_stays_finite():
    model = GPT(GPTConfig.llama_style(**TINY, rope_base=0.5)).eval()
    with torch.no_grad():
        assert torch.isfinite(model(torch.randint(0, 10, (2, 8)))).all()


def test_rmsnorm_and_transformer_config_refuse_an_eps_that_gives_nan():
    with pytest.raises(ValueError, match=r"RMSNorm: eps must be a finite number > 0, got -1"):
        RMSNorm(4, eps=-1)
    with pytest.raises(ValueError, match=r"TransformerConfig: layer_norm_eps must be a finite number > 0, got 0"):
        TransformerConfig(layer_norm_eps=0)


def test_lm_loss_names_the_dtype_the_shape_and_the_range():
    logits = torch.randn(2, 3, 5)
    with pytest.raises(TypeError, match=r"lm_loss: targets must be integer token ids, got dtype torch\.float32"):
        lm_loss(logits, torch.zeros(2, 3))
    with pytest.raises(TypeError, match=r"lm_loss: logits must be a float tensor, got dtype torch\.int64"):
        lm_loss(torch.zeros(2, 3, 5, dtype=torch.long), torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match=r"logits must be \(B, T, V\) and targets \(B, T\), got \(6, 5\) and \(6,\)"):
        lm_loss(logits.reshape(6, 5), torch.zeros(6, dtype=torch.long))
    with pytest.raises(ValueError, match=r"got \(2, 3, 5\) and \(3, 2\)"):
        lm_loss(logits, torch.zeros(3, 2, dtype=torch.long))
    with pytest.raises(ValueError, match=r"targets must lie in \[0, 4\] \(V=5 logits\) or be -100 \(ignored\), got values from 0 to 5"):
        lm_loss(logits, torch.tensor([[0, 1, 2], [3, 4, 5]]))
    with pytest.raises(ValueError, match=r"from -1 to"):
        lm_loss(logits, torch.tensor([[0, 1, 2], [3, 4, -1]]))
    with pytest.raises(ValueError, match=r"there are no targets, shape \(0, 3\)"):
        lm_loss(torch.randn(0, 3, 5), torch.zeros(0, 3, dtype=torch.long))
    with pytest.raises(ValueError, match=r"the logits contain NaN or \+inf, so the loss would be NaN"):
        lm_loss(logits.clone().index_fill_(2, torch.tensor([1]), float("nan")), torch.zeros(2, 3, dtype=torch.long))
    # -100 is F.cross_entropy's ignore_index (lesson 11's copy task): skipped, but not all of them
    ignored = torch.tensor([[0, -100, 2], [-100, 4, 0]])
    expected = torch.nn.functional.cross_entropy(logits.reshape(6, 5), ignored.reshape(6))
    assert lm_loss(logits, ignored) == expected
    with pytest.raises(ValueError, match=r"every target is -100 \(ignored\)"):
        lm_loss(logits, torch.full((2, 3), -100))
    # any integer dtype of targets gives int64's loss; -inf logits (a filtered token) are allowed
    targets = torch.tensor([[0, 1, 2], [3, 4, 0]])
    assert lm_loss(logits, targets.to(torch.uint8)) == lm_loss(logits, targets)
    assert torch.isfinite(lm_loss(logits.clone().index_fill_(2, torch.tensor([4]), -math.inf), targets % 4))


@pytest.mark.parametrize(
    "prompt, kwargs, words",
    [(torch.tensor([1, 2]), {}, r"token ids must be a non-empty \(B, L\) tensor, got shape \(2,\)"),
     (torch.zeros(1, 0, dtype=torch.long), {}, r"non-empty \(B, L\) tensor, got shape \(1, 0\)"),
     (torch.zeros(1, 9, dtype=torch.long), {}, r"9 positions but the model has max_len=8.*ids\[:, -8:\]"),
     (None, dict(top_k=0), r"top_k must be None or an int >= 1, got 0"),
     (None, dict(top_k=2.5), r"top_k must be None or an int >= 1, got 2\.5"),
     (None, dict(top_p=0.0), r"top_p must be None or a number in \(0, 1\], got 0\.0"),
     (None, dict(top_p=1.5), r"top_p must be None or a number in \(0, 1\], got 1\.5"),
     (None, dict(temperature=0), r"temperature must be a finite number > 0, got 0 \(greedy=True"),
     (None, dict(temperature=-0.5), r"temperature must be a finite number > 0, got -0\.5"),
     (None, dict(temperature=float("nan")), r"temperature must be a finite number > 0, got nan"),
     (None, dict(max_new_tokens=2.0), r"max_new_tokens must be an int >= 0, got 2\.0")],
    ids=["1-D", "empty", "longer-than-max_len", "top_k-0", "top_k-float", "top_p-0", "top_p-1.5",
         "temperature-0", "temperature-negative", "temperature-nan", "max_new_tokens-float"],
)
def test_generate_refuses_bad_arguments(gpt, prompt, kwargs, words):
    prompt = torch.zeros(1, 2, dtype=torch.long) if prompt is None else prompt
    kwargs = {"max_new_tokens": 3, **kwargs}
    with pytest.raises(ValueError, match=words):
        gpt.generate(prompt, **kwargs)


def test_generate_refuses_bad_top_p_even_with_nothing_to_generate(gpt):
    with pytest.raises(ValueError, match=r"top_p"):
        gpt.generate(torch.zeros(1, 2, dtype=torch.long), 0, top_p=2.0)


def test_generate_with_top_k_above_the_vocabulary_keeps_every_token(gpt):
    """top_k=100 > V=10 is no filter at all: the same draws as top_k=None."""
    prompt = torch.zeros(2, 2, dtype=torch.long)
    a = gpt.generate(prompt, 6, top_k=100, generator=torch.Generator().manual_seed(1))
    b = gpt.generate(prompt, 6, generator=torch.Generator().manual_seed(1))
    assert torch.equal(a, b)


@pytest.mark.parametrize("greedy", [False, True], ids=["sampled", "greedy"])
def test_generate_from_a_model_with_nan_weights_says_so(greedy):
    """Before: torch.multinomial's 'probability tensor contains inf, nan' (sampled) or a silent
    row of token 0 (greedy: argmax of NaN)."""
    model = GPT(GPTConfig(**TINY)).eval()
    with torch.no_grad():
        model.lm_head.weight[3, 0] = float("nan")
    with pytest.raises(ValueError, match=r"GPT.generate: the model's logits contain NaN or inf"):
        model.generate(torch.zeros(1, 2, dtype=torch.long), 2, greedy=greedy)
    assert not model.training


def test_step_and_rotary_errors(gpt):
    with pytest.raises(TypeError, match=r"GPT.step: tokens must be a torch tensor .*got list"):
        gpt.step([1, 2], gpt.start_cache(2))
    with pytest.raises(ValueError, match=r"positions 0\.\.4 are beyond the rotary table of max_len=4"):
        RotaryEmbedding(8, 4)(torch.randn(1, 1, 5, 8))
    with pytest.raises(ValueError, match=r"positions 3\.\.4 are beyond"):
        RotaryEmbedding(8, 4)(torch.randn(1, 1, 2, 8), start=3)
    with pytest.raises(TypeError, match=r"RotaryEmbedding: start must be an int position, got 1\.0"):
        RotaryEmbedding(8, 4)(torch.randn(1, 1, 2, 8), start=1.0)
    with pytest.raises(ValueError, match=r"num_heads=4 is not divisible by num_kv_heads=3"):
        MultiHeadAttention(16, 4, num_kv_heads=3)


# --- porting into a Hugging Face model of another architecture: refused, the difference named


def _gpt2_port(ours: dict, theirs: dict):
    model = GPT(GPTConfig(**ours))
    load_into_hf_gpt2(model, GPT2LMHeadModel(hf_gpt2_config(GPTConfig(**theirs))))


@pytest.mark.parametrize(
    "change, words",
    [(dict(num_layers=2), r"num_layers / n_layer: 1 vs 2"),
     (dict(num_heads=4), r"num_heads / n_head: 2 vs 4"),  # the same shapes: silently wrong before
     (dict(layer_norm_eps=1e-3), r"layer_norm_eps / layer_norm_epsilon: 1e-05 vs 0\.001"),
     (dict(max_len=16), r"max_len / n_positions: 8 vs 16"),
     (dict(d_ff=32), r"d_ff / n_inner: 64 vs 32"),
     (dict(vocab_size=12), r"vocab_size: 10 vs 12")],
)
def test_load_into_hf_gpt2_names_the_architecture_difference(change, words):
    with pytest.raises(ValueError, match=r"load_into_hf_gpt2: the Hugging Face model is not the same "
                                         r"architecture \(ours vs theirs\): .*" + words):
        _gpt2_port(TINY, {**TINY, **change})


def test_load_into_hf_gpt2_with_fewer_layers_is_not_a_key_error():
    with pytest.raises(ValueError, match=r"num_layers / n_layer: 2 vs 1"):
        _gpt2_port({**TINY, "num_layers": 2}, TINY)


def test_gpt2_ports_refuse_other_blocks_and_other_models():
    with pytest.raises(ValueError, match=r"GPT2LMHeadModel is GPT-2's block .*'tie_embeddings': False"):
        load_into_hf_gpt2(GPT(GPTConfig(**TINY, tie_embeddings=False)), GPT2LMHeadModel(hf_gpt2_config(GPTConfig(**TINY))))
    with pytest.raises(ValueError, match=r"hf_gpt2_config: GPT2LMHeadModel is GPT-2's block .*'norm': 'rmsnorm'"):
        hf_gpt2_config(GPTConfig.llama_style(**TINY))
    with pytest.raises(ValueError, match=r"'activation': 'gelu'"):
        hf_gpt2_config(GPTConfig(**TINY, activation="gelu"))
    llama = LlamaForCausalLM(hf_llama_config(GPTConfig.llama_style(**TINY)))
    with pytest.raises(TypeError, match=r"load_into_hf_gpt2: needs a transformers GPT2LMHeadModel, got LlamaForCausalLM"):
        load_into_hf_gpt2(GPT(GPTConfig(**TINY)), llama)
    with pytest.raises(TypeError, match=r"from_hf_gpt2: needs a transformers GPT2LMHeadModel, got LlamaForCausalLM"):
        from_hf_gpt2(llama)
    with pytest.raises(TypeError, match=r"from_hf_llama: needs a transformers LlamaForCausalLM, got GPT2LMHeadModel"):
        from_hf_llama(GPT2LMHeadModel(hf_gpt2_config(GPTConfig(**TINY))))


def test_from_hf_gpt2_refuses_what_gpt_config_cannot_express():
    untied = GPT2LMHeadModel(GPT2Config(**hf_gpt2_config(GPTConfig(**TINY)).to_dict() | {"tie_word_embeddings": False}))
    with pytest.raises(ValueError, match=r"from_hf_gpt2: .*tie_embeddings / tie_word_embeddings: True vs False"):
        from_hf_gpt2(untied)
    unscaled = GPT2LMHeadModel(GPT2Config(**hf_gpt2_config(GPTConfig(**TINY)).to_dict() | {"scale_attn_weights": False}))
    with pytest.raises(ValueError, match=r"scale_attn_weights: True vs False"):
        from_hf_gpt2(unscaled)


LLAMA_TINY = dict(vocab_size=10, max_len=8, d_model=32, num_heads=4, num_layers=1)


@pytest.mark.parametrize(
    "change, words",
    [(dict(num_layers=2), r"num_layers / num_hidden_layers: 1 vs 2"),
     (dict(num_heads=2), r"num_heads / num_attention_heads: 4 vs 2"),  # same shapes
     (dict(num_kv_heads=2), r"num_kv_heads / num_key_value_heads: 4 vs 2"),
     (dict(rope_base=500000.0), r"rope_base / rope_theta: 10000\.0 vs 500000\.0"),  # no weight shows it
     (dict(layer_norm_eps=1e-5), r"layer_norm_eps / rms_norm_eps: 1e-06 vs 1e-05"),
     (dict(max_len=16), r"max_len / max_position_embeddings: 8 vs 16"),
     (dict(d_ff=40), r"d_ff / intermediate_size: 85 vs 40"),
     (dict(tie_embeddings=True), r"tie_embeddings / tie_word_embeddings: False vs True"),
     (dict(bias=True), r"bias / attention_bias: False vs True")],
)
def test_load_into_hf_llama_names_the_architecture_difference(change, words):
    model = GPT(GPTConfig.llama_style(**LLAMA_TINY))
    theirs = LlamaForCausalLM(hf_llama_config(GPTConfig.llama_style(**{**LLAMA_TINY, **change})))
    with pytest.raises(ValueError, match=r"load_into_hf_llama: the Hugging Face model is not the same "
                                         r"architecture \(ours vs theirs\): .*" + words):
        load_into_hf_llama(model, theirs)


def test_load_into_hf_llama_with_fewer_layers_is_not_a_key_error():
    model = GPT(GPTConfig.llama_style(**{**LLAMA_TINY, "num_layers": 2}))
    with pytest.raises(ValueError, match=r"num_layers / num_hidden_layers: 2 vs 1"):
        load_into_hf_llama(model, LlamaForCausalLM(hf_llama_config(GPTConfig.llama_style(**LLAMA_TINY))))


# --- train_lm's recipe and arguments


@pytest.mark.parametrize(
    "kwargs, words",
    [(dict(batch_size=0), r"batch_size must be >= 1, got 0"),
     (dict(num_steps=50, warmup=50), r"warmup=50 must be below num_steps=50"),
     (dict(lr=-1e-3), r"lr must be a finite number > 0, got -0\.001"),
     (dict(lr=float("nan")), r"lr must be a finite number > 0, got nan"),
     (dict(min_lr=1.0), r"min_lr must lie in \[0, lr=0\.001\], got 1\.0"),
     (dict(betas=(0.9, 1.0)), r"betas must be two numbers in \[0, 1\), got \(0\.9, 1\.0\)"),
     (dict(weight_decay=-0.1), r"weight_decay must be a number >= 0"),
     (dict(max_grad_norm=0), r"max_grad_norm must be None or a number > 0, got 0")],
)
def test_lm_recipe_refuses_bad_values(kwargs, words):
    with pytest.raises(ValueError, match="LMRecipe: " + words):
        LMRecipe(**kwargs)


def test_train_lm_refuses_bad_arguments_before_training():
    from course_lib.lm_training import train_lm
    from course_lib.data.shakespeare import Play, ShakespeareCorpus

    text = "to be, or not to be\n" * 10
    corpus = ShakespeareCorpus(validation_plays=("B",), plays=[Play("A", "a", text), Play("B", "b", text)])
    recipe = LMRecipe(num_layers=1, num_heads=2, d_model=16, block_size=8, batch_size=4, num_steps=2, warmup=1)
    for kwargs, words in [(dict(val_windows=0), r"val_windows must be an int >= 1, got 0"),
                          (dict(eval_every=-1), r"eval_every must be an int >= 0, got -1"),
                          (dict(train_windows=2.0), r"train_windows must be an int >= 0, got 2\.0")]:
        with pytest.raises(ValueError, match="train_lm: " + words):
            train_lm(corpus, recipe, progress=False, **kwargs)
    # a batch larger than the text's distinct windows works: windows are drawn with replacement
    big = LMRecipe(num_layers=1, num_heads=2, d_model=16, block_size=8, batch_size=512, num_steps=2, warmup=1)
    run = train_lm(corpus, big, progress=False, val_windows=4)
    assert len(run.losses) == 2 and all(math.isfinite(x) for x in run.losses)
