"""course_lib's attention-only GPT inside TransformerLens 4 (lesson 12).

TransformerLens 4 removed ``HookedTransformer`` and ``HookedTransformerConfig``. A model is now a
``TransformerBridge`` around an ``nn.Module``; ``TransformerBridge.boot_native(config)`` builds the
library's own small model (TL-native, nothing downloaded) from a ``TransformerBridgeConfig``.
``to_transformer_bridge(model)`` boots one of our model's sizes, copies our weights in with
``bridge.load_state_dict`` (keys ``blocks.{l}.attn.q.weight`` ...) and switches on
``enable_compatibility_mode(no_processing=True)``: HookedTransformer's hook names
(``blocks.{l}.attn.hook_z`` as ``(B, T, h, d_head)``, ``hook_pattern``) without folding LayerNorm
into the weights or centring them, so the weights stay ours, one for one.

The conventions that differ:

- The native attention keeps ``nn.Linear``'s ``(out, in)`` for ``q``, ``k``, ``v``, ``o``, as we do;
  ``W_Q`` and friends are per-head views ``(h, d_model, d_head)`` of the same numbers.
- RoPE: the native model always turns ADJACENT pairs ``(2i, 2i + 1)`` (Llama's layout). Ours turns
  ``(i, i + head_dim/2)`` (``"halves"``, GPT-NeoX's ``rotate_half``; lesson 11). Its config accepts
  ``rotary_adjacent_pairs=False`` and ignores it. So the rows of ``W_Q`` and ``W_K`` (and their biases)
  are permuted within each head, ``0, hd/2, 1, hd/2 + 1, ...``: the same dot products, so the same
  patterns and logits, but ``hook_q`` and ``hook_k`` list each head's numbers in that other order.
- ``TransformerBridgeConfig`` rounds ``rotary_base`` to an int (0.5 would become 0, and a model
  booted from it NaN logits); ``bridge_config`` writes the model's own base back after building it,
  and the port installs our own rotary tables (float base kept) in the native model as well.
- Grouped-query attention (``num_kv_heads < num_heads``): the native model shares each key/value
  head with ``num_heads // num_kv_heads`` query heads by ``repeat_interleave``, as ours does.
"""

from __future__ import annotations

import torch
from torch import nn

from .gpt import GPT
from .rope import LAYOUTS

__all__ = ["bridge_config", "to_transformer_bridge", "rotary_permutation"]


def _check_model(model: object, where: str) -> GPT:
    if isinstance(model, type) or not isinstance(model, GPT):
        what = model.__name__ if isinstance(model, type) else type(model).__name__
        hint = (" (a GPTConfig describes a model: build it with GPT(config) and train or load it)"
                if what == "GPTConfig" else "")
        raise TypeError(f"{where}: expected a course_lib GPT (the model itself), got {what}{hint}")
    c = model.config
    if not c.attn_only or c.norm != "layernorm" or c.positional not in ("rope", "learned"):
        raise ValueError(f"{where}: ports an attn_only GPT with LayerNorm and RoPE or learned "
                         f"positions, got attn_only={c.attn_only}, norm={c.norm!r}, "
                         f"positional={c.positional!r}")
    dtypes = {p.dtype for p in model.parameters()}
    if len(dtypes) != 1 or not next(iter(dtypes)).is_floating_point:
        raise ValueError(f"{where}: the model's parameters must share one float dtype, got {dtypes}")
    return model


def rotary_permutation(head_dim: int, layout: str = "halves") -> torch.Tensor:
    """``(head_dim,)``: the order in which to list one head's query and key numbers so that a model
    turning adjacent pairs turns the same planes as ours. ``"halves"``: ``[0, hd/2, 1, hd/2 + 1, ...]``
    (plane i is numbers i and i + hd/2); ``"pairs"``: unchanged. ``head_dim`` even (planes of two)."""
    if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim < 2 or head_dim % 2:
        raise ValueError(f"rotary_permutation: head_dim must be an even int >= 2 (RoPE turns planes of "
                         f"two numbers), got {head_dim!r}; pass the model's config.head_dim")
    if layout not in LAYOUTS:
        raise ValueError(f"rotary_permutation: layout must be one of {LAYOUTS} (lowercase, as "
                         f"RotaryEmbedding.layout), got {layout!r}")
    if layout == "pairs":
        return torch.arange(head_dim)
    half = head_dim // 2
    return torch.stack([torch.arange(half), torch.arange(half) + half], dim=-1).flatten()  # (hd,)


def bridge_config(model: GPT):
    """The ``TransformerBridgeConfig`` of ``model``, an attention-only course GPT with LayerNorm and
    RoPE or learned positions, in the model's dtype. Its ``rotary_base`` is the model's ``rope_base``:
    the config's constructor rounds it to an int, so a fractional base (0.5 would become 0, and NaN
    logits) is written back after it."""
    from transformer_lens import TransformerBridgeConfig

    c = _check_model(model, "bridge_config").config
    rotary = c.positional == "rope"
    extra = dict(rotary_dim=c.head_dim, rotary_base=c.rope_base) if rotary else {}
    config = TransformerBridgeConfig(
        n_layers=c.num_layers, d_model=c.d_model, n_ctx=c.max_len, d_head=c.head_dim,
        n_heads=c.num_heads, n_key_value_heads=c.num_kv_heads if c.num_kv_heads != c.num_heads else None,
        d_vocab=c.vocab_size, attn_only=True, normalization_type="LN", eps=c.layer_norm_eps,
        positional_embedding_type="rotary" if rotary else "standard", act_fn=None, seed=0,
        default_prepend_bos=False, device="cpu", dtype=next(model.parameters()).dtype, **extra)
    if rotary and config.rotary_base != c.rope_base:  # rounded by its __init__: the real base back
        config.rotary_base = float(c.rope_base)
    return config


def _linear(layer: nn.Linear, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    bias = layer.bias if layer.bias is not None else torch.zeros(rows, dtype=layer.weight.dtype)
    return layer.weight, bias


@torch.no_grad()
def to_transformer_bridge(model: GPT, permute_rotary: bool = True):
    """A ``TransformerBridge`` (TL-native model, compatibility mode, no weight processing, eval mode)
    with ``model``'s weights and dtype. Its logits, ``hook_pattern`` and ``hook_z`` equal ours.
    ``permute_rotary=False`` skips the RoPE layout's permutation, only to see what goes wrong."""
    from transformer_lens import TransformerBridge

    model = _check_model(model, "to_transformer_bridge")
    if not isinstance(permute_rotary, bool):
        raise TypeError(f"to_transformer_bridge: permute_rotary must be True or False, got {permute_rotary!r}")
    c = model.config
    dtype = next(model.parameters()).dtype
    bridge = TransformerBridge.boot_native(bridge_config(model), dtype=dtype)
    h, kv, hd, d = c.num_heads, c.num_kv_heads, c.head_dim, c.d_model
    layout = model.rotary.layout if c.positional == "rope" and permute_rotary else "pairs"
    perm = rotary_permutation(hd, layout)

    def per_head_rows(t: torch.Tensor, heads: int) -> torch.Tensor:  # rows (heads * hd, ...) permuted
        return t.reshape(heads, hd, *t.shape[1:])[:, perm].reshape(t.shape)

    sd = {"embed.weight": model.embed.token.embedding.weight,
          "unembed.weight": model.lm_head.weight,
          "unembed.bias": (model.lm_head.bias if model.lm_head.bias is not None
                           else torch.zeros(c.vocab_size, dtype=dtype)),
          "ln_final.weight": model.blocks.norm.weight, "ln_final.bias": model.blocks.norm.bias}
    if c.positional == "learned":
        sd["pos_embed.weight"] = model.embed.position.embedding.weight
    for i, layer in enumerate(model.blocks.layers):
        attn, p = layer.self_attn, f"blocks.{i}."
        sd[p + "ln1.weight"], sd[p + "ln1.bias"] = layer.norm1.weight, layer.norm1.bias
        for name, proj, heads in (("q", attn.q_proj, h), ("k", attn.k_proj, kv), ("v", attn.v_proj, kv)):
            weight, bias = _linear(proj, heads * hd)
            if name != "v":  # the RoPE layout: adjacent pairs in TransformerLens
                weight, bias = per_head_rows(weight, heads), per_head_rows(bias, heads)
            sd[p + f"attn.{name}.weight"], sd[p + f"attn.{name}.bias"] = weight, bias
        sd[p + "attn.o.weight"], sd[p + "attn.o.bias"] = _linear(attn.out_proj, d)
    result = bridge.load_state_dict({k: v.detach().clone() for k, v in sd.items()}, strict=False)
    if result.unexpected_keys or result.missing_keys:
        raise RuntimeError(f"to_transformer_bridge: missing {result.missing_keys}, unexpected "
                           f"{result.unexpected_keys}")
    native = bridge.original_model
    if c.positional == "rope":  # our tables (float rope_base), listed in adjacent-pair order
        native.rotary.cos_cached = model.rotary.cos[:, perm].to(dtype).clone()
        native.rotary.sin_cached = model.rotary.sin[:, perm].to(dtype).clone()
    bridge.enable_compatibility_mode(no_processing=True, disable_warnings=True)
    return bridge.eval()
