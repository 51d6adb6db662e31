"""course_lib's attention-only GPT as a TransformerLens ``HookedTransformer`` (lesson 12).

Built from a ``HookedTransformerConfig`` (nothing downloaded), weights copied, no processing
(``from_pretrained`` would fold LayerNorm weights into the next matrices and centre the writing
weights; a model built from a config keeps them as they are, so the numbers equal ours).

The conventions that differ:

- ``nn.Linear`` stores ``(out, in)`` and applies ``x @ W.T``; TransformerLens stores per head and
  applies ``x @ W``: ``W_Q, W_K, W_V`` are ``(h, d_model, d_head)``, ``W_O`` is ``(h, d_head, d_model)``,
  biases ``b_Q, b_K, b_V`` are ``(h, d_head)``; ``W_U`` is ``(d_model, V)``, our ``lm_head.weight.T``.
- ``hook_pattern`` is ``blocks.{l}.attn.hook_pattern``: ``(B, h, query, key)``, our ``attn_weights``;
  ``hook_z`` is ``(B, T, h, d_head)``, our ``out_proj`` input viewed per head.
- RoPE: ``positional_embedding_type="rotary"`` with ``rotary_adjacent_pairs=False`` is our
  ``"halves"`` layout (GPT-NeoX's ``rotate_half``).
"""

from __future__ import annotations

import torch

from .gpt import GPT

__all__ = ["hooked_transformer_config", "to_hooked_transformer"]


def hooked_transformer_config(model: GPT):
    """The ``HookedTransformerConfig`` of ``model`` (a 2-layer attention-only RoPE GPT, or any
    ``attn_only`` course GPT with LayerNorm and RoPE or learned positions)."""
    from transformer_lens import HookedTransformerConfig

    c = model.config
    if not c.attn_only or c.norm != "layernorm" or c.positional not in ("rope", "learned"):
        raise ValueError("hooked_transformer_config: ports an attn_only GPT with LayerNorm and "
                         f"RoPE or learned positions, got {c}")
    rotary = c.positional == "rope"
    extra = dict(rotary_dim=c.head_dim, rotary_base=int(c.rope_base), rotary_adjacent_pairs=False) if rotary else {}
    return HookedTransformerConfig(
        n_layers=c.num_layers, d_model=c.d_model, n_ctx=c.max_len, d_head=c.head_dim, n_heads=c.num_heads,
        d_vocab=c.vocab_size, attn_only=True, normalization_type="LN", eps=c.layer_norm_eps,
        positional_embedding_type="rotary" if rotary else "standard", act_fn=None, seed=None,
        default_prepend_bos=False, device="cpu", dtype=torch.float32, **extra,
    )


@torch.no_grad()
def to_hooked_transformer(model: GPT):
    """A ``HookedTransformer`` with ``model``'s weights (eval mode)."""
    from transformer_lens import HookedTransformer

    c = model.config
    tl = HookedTransformer(hooked_transformer_config(model))
    h, hd, d = c.num_heads, c.head_dim, c.d_model
    sd = {"embed.W_E": model.embed.token.embedding.weight, "unembed.W_U": model.lm_head.weight.T,
          "unembed.b_U": torch.zeros(c.vocab_size),
          "ln_final.w": model.blocks.norm.weight, "ln_final.b": model.blocks.norm.bias}
    if c.positional == "learned":
        sd["pos_embed.W_pos"] = model.embed.position.embedding.weight
    zeros = torch.zeros(h, hd)
    for i, layer in enumerate(model.blocks.layers):
        attn, p = layer.self_attn, f"blocks.{i}."
        sd[p + "ln1.w"], sd[p + "ln1.b"] = layer.norm1.weight, layer.norm1.bias
        for name, proj in (("Q", attn.q_proj), ("K", attn.k_proj), ("V", attn.v_proj)):
            sd[p + f"attn.W_{name}"] = proj.weight.view(h, hd, d).transpose(1, 2)  # (h, d, hd)
            sd[p + f"attn.b_{name}"] = zeros if proj.bias is None else proj.bias.view(h, hd)
        sd[p + "attn.W_O"] = attn.out_proj.weight.T.reshape(h, hd, d)  # (d, h*hd) -> (h, hd, d)
        sd[p + "attn.b_O"] = torch.zeros(d) if attn.out_proj.bias is None else attn.out_proj.bias
    missing, unexpected = tl.load_state_dict({k: v.clone() for k, v in sd.items()}, strict=False)
    if unexpected or any(not k.endswith(("mask", "IGNORE", "rotary_sin", "rotary_cos")) for k in missing):
        raise RuntimeError(f"to_hooked_transformer: missing {missing}, unexpected {unexpected}")
    return tl.eval()
