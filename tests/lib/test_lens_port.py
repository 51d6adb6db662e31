"""course_lib.lens_port: our attention-only GPT inside TransformerLens 4's TransformerBridge equals
ours in float64 to ~1e-10 (logits, hook_pattern, hook_z, a zero-ablation through run_with_hooks),
on several sizes, RoPE and learned positions, grouped-query attention and float RoPE bases; and bad
input gets a message."""

from __future__ import annotations

import pytest
import torch
from torch import nn

pytest.importorskip("transformer_lens")

from course_lib import interp  # noqa: E402
from course_lib.gpt import GPT  # noqa: E402
from course_lib.induction import induction_config, repeated_tokens  # noqa: E402
from course_lib.lens_port import rotary_permutation, to_transformer_bridge  # noqa: E402

TOL = {torch.float64: 1e-10, torch.float32: 1e-4}


def random_model(seed: int = 0, dtype=torch.float64, **changes) -> GPT:
    """An attention-only model with weights far from the initialisation (uneven patterns)."""
    torch.manual_seed(seed)
    model = GPT(induction_config(**changes)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    return model.to(dtype)


def ids(batch=3, n=11, seed=1, vocab=64):
    return repeated_tokens(batch, n, vocab, torch.Generator().manual_seed(seed))


def assert_equal_to_bridge(model: GPT, x: torch.Tensor, head: int = 1) -> torch.Tensor:
    """Logits, every layer's hook_pattern and hook_z, and a zero-ablation of head ``head`` of layer
    0 through run_with_hooks, all equal to ours at the dtype's tolerance; returns the logit gap."""
    dtype = next(model.parameters()).dtype
    tol = TOL[dtype]
    bridge = to_transformer_bridge(model)
    assert next(bridge.parameters()).dtype == dtype  # the model's dtype kept
    with torch.no_grad():
        ours = model(x)
        theirs, cache = bridge.run_with_cache(x)
    gap = (theirs - ours).abs().max().item()
    assert theirs.dtype == dtype and gap <= tol
    for layer, pattern in enumerate(interp.attention_patterns(model, x)):
        assert (cache[f"blocks.{layer}.attn.hook_pattern"] - pattern).abs().max() <= tol
    for layer, z in enumerate(interp.head_outputs(model, x)):
        assert cache[f"blocks.{layer}.attn.hook_z"].shape == z.shape
        assert (cache[f"blocks.{layer}.attn.hook_z"] - z).abs().max() <= tol

    def zero_head(z, hook):
        z[:, :, head] = 0.0
        return z

    with torch.no_grad():
        their_ablation = bridge.run_with_hooks(x, fwd_hooks=[("blocks.0.attn.hook_z", zero_head)])
        with interp.hooked(model, 0, interp.ablation_hook(head, model.config.num_heads)):
            our_ablation = model(x)
    assert (their_ablation - our_ablation).abs().max() <= tol
    assert (our_ablation - ours).abs().max() > 0.05  # the ablation did something
    return gap


@pytest.mark.parametrize("changes", [
    dict(), dict(positional="learned"), dict(num_layers=1, num_heads=2, d_model=16),
    dict(num_layers=3, num_heads=8, d_model=64, vocab_size=17),
    dict(num_heads=2, d_model=128, vocab_size=1000, max_len=24),
], ids=["lesson", "learned", "1 layer 2 heads of 8", "3 layers 8 heads of 8", "heads of 64"])
def test_equal_to_transformer_bridge_in_float64(changes):
    model = random_model(**changes)
    gap = assert_equal_to_bridge(model, ids(vocab=model.config.vocab_size))
    assert gap <= 1e-10


def test_equal_in_float32_and_the_dtype_is_kept():
    model = random_model(dtype=torch.float32)
    assert_equal_to_bridge(model, ids())


@pytest.mark.parametrize("base", [2.5, 1000.5, 0.5, 10000.0])
def test_a_float_rope_base_is_kept(base):
    model = random_model(rope_base=base)
    assert_equal_to_bridge(model, ids())


def test_grouped_query_attention_is_supported():
    model = random_model(num_kv_heads=2)
    assert model.blocks.layers[0].self_attn.k_proj.weight.shape == (64, 128)  # 2 kv heads of 32
    assert_equal_to_bridge(model, ids())
    assert_equal_to_bridge(random_model(num_kv_heads=1, seed=3), ids(), head=3)  # multi-query


def test_without_the_rotary_permutation_the_logits_are_far_off():
    """TransformerLens's native RoPE turns adjacent pairs; ours turns halves. Skipping the
    permutation gives no error, only other numbers: the lesson-11 pitfall."""
    model, x = random_model(), ids()
    bridge = to_transformer_bridge(model, permute_rotary=False)
    with torch.no_grad():
        assert (bridge(x) - model(x)).abs().max() > 0.5
    with pytest.raises(TypeError, match="permute_rotary must be True or False"):
        to_transformer_bridge(model, permute_rotary="no")


def test_rotary_permutation_pairs_each_plane():
    perm = rotary_permutation(8)
    assert perm.tolist() == [0, 4, 1, 5, 2, 6, 3, 7]
    assert rotary_permutation(8, "pairs").tolist() == list(range(8))


def test_bad_models_get_a_message():
    with pytest.raises(TypeError, match="GPTConfig describes a model"):
        to_transformer_bridge(induction_config())
    with pytest.raises(TypeError, match="got Linear"):
        to_transformer_bridge(nn.Linear(4, 4))
    with pytest.raises(TypeError, match="got GPT"):  # the class, not a model
        to_transformer_bridge(GPT)
    with pytest.raises(ValueError, match="attn_only"):
        to_transformer_bridge(GPT(induction_config(attn_only=False)))
    with pytest.raises(ValueError, match="rmsnorm"):
        to_transformer_bridge(GPT(induction_config(norm="rmsnorm")))
    model = random_model()
    model.blocks.layers[0].norm1.float()
    with pytest.raises(ValueError, match="one float dtype"):
        to_transformer_bridge(model)


# --- bad input (issue #48): what was expected, what came, how to fix it ---


@pytest.mark.parametrize("base", [0.5, 2.5, 1000.5])
def test_bridge_config_keeps_a_fractional_rope_base(base):
    """TransformerBridgeConfig rounds rotary_base to an int (0.5 -> 0: NaN logits from a bridge booted
    from it); bridge_config writes the model's base back, so the native model's own tables are ours."""
    from transformer_lens import TransformerBridge

    from course_lib.lens_port import bridge_config

    model = random_model(rope_base=base)
    config = bridge_config(model)
    assert config.rotary_base == base
    bridge = TransformerBridge.boot_native(config, dtype=torch.float64)  # its own tables, not ours
    with torch.no_grad():
        assert torch.isfinite(bridge(ids())).all()
    native = bridge.original_model.rotary.cos_cached
    ours = model.rotary.cos[:, rotary_permutation(model.config.head_dim)]
    assert (native.double() - ours[: native.size(0)]).abs().max() <= 1e-6
    assert bridge_config(random_model(rope_base=10000.0)).rotary_base == 10000  # an integer base: as before


@pytest.mark.parametrize("head_dim, layout, words", [
    (8, "Halves", r"layout must be one of \('halves', 'pairs'\) \(lowercase, as RotaryEmbedding.layout\), "
                  r"got 'Halves'"),
    (8, "interleaved", r"layout must be one of \('halves', 'pairs'\)"),
    (7, "halves", r"head_dim must be an even int >= 2 \(RoPE turns planes of two numbers\), got 7"),
    (0, "pairs", r"head_dim must be an even int >= 2 .* got 0"),
    (8.0, "halves", r"head_dim must be an even int >= 2 .* got 8.0"),
])
def test_rotary_permutation_refuses_unknown_layouts_and_odd_head_dims(head_dim, layout, words):
    with pytest.raises(ValueError, match=r"rotary_permutation: " + words):
        rotary_permutation(head_dim, layout)
