"""The course's Llama-style model and Hugging Face's ``LlamaForCausalLM``, both ways (lesson 11).

The model is lesson 09's ``GPT`` built from ``GPTConfig.llama_style()``: RMSNorm, RoPE, SwiGLU,
grouped-query attention, no biases. Hugging Face names the same weights differently:

    course_lib (GPT)                         Hugging Face (LlamaForCausalLM)
    embed.token.embedding.weight             model.embed_tokens.weight
    blocks.layers.i.norm1.weight             model.layers.i.input_layernorm.weight
    blocks.layers.i.self_attn.q_proj.weight  model.layers.i.self_attn.q_proj.weight   (k, v alike)
    blocks.layers.i.self_attn.out_proj.weight  model.layers.i.self_attn.o_proj.weight
    blocks.layers.i.norm2.weight             model.layers.i.post_attention_layernorm.weight
    blocks.layers.i.feed_forward.gate.weight model.layers.i.mlp.gate_proj.weight
    blocks.layers.i.feed_forward.up.weight   model.layers.i.mlp.up_proj.weight
    blocks.layers.i.feed_forward.linear2.weight  model.layers.i.mlp.down_proj.weight
    blocks.norm.weight                       model.norm.weight
    lm_head.weight                           lm_head.weight

Both store ``nn.Linear`` weights ``(out, in)``: nothing is transposed (unlike GPT-2's ``Conv1D``).
The one trap is RoPE's layout: Hugging Face turns halves (``rotate_half``), so the course's model
must too (``RotaryEmbedding(layout="halves")``, the default); see ``course_lib.rope``.
"""

from __future__ import annotations

import torch

from .gpt import GPT, GPTConfig, config_differences

__all__ = ["hf_llama_config", "llama_name_map", "load_into_hf_llama", "from_hf_llama"]


def _check_llama_style(config: GPTConfig, where: str) -> None:
    wanted = dict(norm="rmsnorm", positional="rope", activation="swiglu", attn_only=False)
    wrong = {k: getattr(config, k, v) for k, v in wanted.items() if getattr(config, k, v) != v}
    if wrong:
        raise ValueError(
            f"{where}: LlamaForCausalLM has RMSNorm, RoPE and SwiGLU; this config has {wrong}. "
            "Build it with GPTConfig.llama_style(...)"
        )


def _llama_pairs(config: GPTConfig, c) -> list[tuple[str, object, object]]:
    """course_lib's fields against a ``LlamaConfig``'s, one triple per field that shapes the model."""
    rope = dict(c.rope_parameters or {})
    return [
        ("num_layers / num_hidden_layers", config.num_layers, c.num_hidden_layers),
        ("num_heads / num_attention_heads", config.num_heads, c.num_attention_heads),
        ("num_kv_heads / num_key_value_heads", config.num_kv_heads, c.num_key_value_heads),
        ("d_model / hidden_size", config.d_model, c.hidden_size),
        ("head_dim", config.head_dim, getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads),
        ("d_ff / intermediate_size", config.d_ff, c.intermediate_size),
        ("vocab_size", config.vocab_size, c.vocab_size),
        ("max_len / max_position_embeddings", config.max_len, c.max_position_embeddings),
        ("rope_base / rope_theta", float(config.rope_base), rope.get("rope_theta", getattr(c, "rope_theta", None))),
        ("RoPE / rope_type", "default", rope.get("rope_type", "default")),
        ("layer_norm_eps / rms_norm_eps", config.layer_norm_eps, c.rms_norm_eps),
        ("tie_embeddings / tie_word_embeddings", config.tie_embeddings, c.tie_word_embeddings),
        ("bias / attention_bias", config.bias, c.attention_bias),
        ("bias / mlp_bias", config.bias, c.mlp_bias),
        ("SwiGLU / hidden_act", "silu", c.hidden_act),
    ]


def _check_hf_llama(hf_model, where: str) -> None:
    from transformers import LlamaForCausalLM

    if not isinstance(hf_model, LlamaForCausalLM):
        raise TypeError(f"{where}: needs a transformers LlamaForCausalLM, got {type(hf_model).__name__}")


def hf_llama_config(config: GPTConfig):
    """The ``transformers.LlamaConfig`` of the same model (random weights, nothing downloaded)."""
    from transformers import LlamaConfig

    _check_llama_style(config, "hf_llama_config")
    return LlamaConfig(
        vocab_size=config.vocab_size, hidden_size=config.d_model, intermediate_size=config.d_ff,
        num_hidden_layers=config.num_layers, num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads, hidden_act="silu",
        max_position_embeddings=config.max_len, rms_norm_eps=config.layer_norm_eps,
        tie_word_embeddings=config.tie_embeddings, attention_bias=config.bias, mlp_bias=config.bias,
        attention_dropout=config.dropout,
        rope_parameters={"rope_type": "default", "rope_theta": config.rope_base},
        bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )


def llama_name_map(config: GPTConfig) -> dict[str, str]:
    """course_lib parameter name -> Hugging Face's, for every parameter of the model."""
    names = {"embed.token.embedding.weight": "model.embed_tokens.weight",
             "blocks.norm.weight": "model.norm.weight"}
    if not config.tie_embeddings:
        names["lm_head.weight"] = "lm_head.weight"
    parts = [("norm1", "input_layernorm"), ("norm2", "post_attention_layernorm")]
    linears = [("self_attn.q_proj", "self_attn.q_proj"), ("self_attn.k_proj", "self_attn.k_proj"),
               ("self_attn.v_proj", "self_attn.v_proj"), ("self_attn.out_proj", "self_attn.o_proj"),
               ("feed_forward.gate", "mlp.gate_proj"), ("feed_forward.up", "mlp.up_proj"),
               ("feed_forward.linear2", "mlp.down_proj")]
    for i in range(config.num_layers):
        ours, theirs = f"blocks.layers.{i}.", f"model.layers.{i}."
        for a, b in parts:
            names[ours + a + ".weight"] = theirs + b + ".weight"
        for a, b in linears:
            names[ours + a + ".weight"] = theirs + b + ".weight"
            if config.bias:
                names[ours + a + ".bias"] = theirs + b + ".bias"
    return names


@torch.no_grad()
def load_into_hf_llama(model: GPT, hf_model) -> None:
    """Copy ``model``'s weights into a ``LlamaForCausalLM`` built from ``hf_llama_config(model.config)``."""
    _check_llama_style(model.config, "load_into_hf_llama")
    if model.rotary.layout != "halves":
        raise ValueError("load_into_hf_llama: Hugging Face's Llama turns halves (rotate_half); this "
                         f"model's rotary layout is {model.rotary.layout!r}")
    _check_hf_llama(hf_model, "load_into_hf_llama")
    differences = config_differences(_llama_pairs(model.config, hf_model.config))
    if differences:  # same shapes can hide other heads or rope_theta; more layers would stay random
        raise ValueError(
            "load_into_hf_llama: the Hugging Face model is not the same architecture (ours vs "
            f"theirs): {'; '.join(differences)}. Build it with "
            "LlamaForCausalLM(hf_llama_config(model.config))"
        )
    ours, theirs = model.state_dict(), hf_model.state_dict()
    for name, hf_name in llama_name_map(model.config).items():
        if theirs[hf_name].shape != ours[name].shape:
            raise ValueError(f"load_into_hf_llama: {hf_name} is {tuple(theirs[hf_name].shape)}, "
                             f"course_lib's {name} is {tuple(ours[name].shape)}; build the Hugging "
                             "Face model from hf_llama_config(model.config)")
        theirs[hf_name].copy_(ours[name])


@torch.no_grad()
def from_hf_llama(hf_model) -> GPT:
    """A course_lib ``GPT`` with the weights of a ``LlamaForCausalLM`` (default RoPE, SiLU)."""
    _check_hf_llama(hf_model, "from_hf_llama")
    c = hf_model.config
    rope = c.rope_parameters or {}
    if rope.get("rope_type", "default") != "default" or c.hidden_act != "silu":
        raise ValueError(f"from_hf_llama: only plain RoPE and SiLU, got {rope} and {c.hidden_act!r}")
    if c.head_dim != c.hidden_size // c.num_attention_heads or c.attention_bias != c.mlp_bias:
        raise ValueError("from_hf_llama: needs head_dim = hidden_size // num_attention_heads and the "
                         "same bias setting for attention and MLP")
    config = GPTConfig.llama_style(
        vocab_size=c.vocab_size, max_len=c.max_position_embeddings, d_model=c.hidden_size,
        num_heads=c.num_attention_heads, num_kv_heads=c.num_key_value_heads, num_layers=c.num_hidden_layers,
        d_ff=c.intermediate_size, layer_norm_eps=c.rms_norm_eps, tie_embeddings=c.tie_word_embeddings,
        bias=c.attention_bias, rope_base=rope.get("rope_theta", 10000.0),
    )
    model = GPT(config)
    ours, theirs = model.state_dict(), hf_model.state_dict()
    for name, hf_name in llama_name_map(config).items():
        ours[name].copy_(theirs[hf_name])
    return model.eval()
