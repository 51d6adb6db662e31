"""A decoder-only language model, GPT-2's architecture exactly (lesson 09).

Lesson 05's decoder layer without its middle (cross-attention) is lesson 04's encoder layer run
with a causal mask, so a GPT is built from the parts the course already has:

    TransformerEmbedding(learned positions, no sqrt(d_model) scaling)
    -> Encoder(num_layers pre-LN layers with GELU (tanh), causal mask, final LayerNorm)
    -> lm_head, the token embedding's matrix again (tied)

GPT-2's details: learned positions, pre-LN, a final LayerNorm, GELU's tanh approximation (Hugging
Face's "gelu_new"), tied input and output embeddings, LayerNorm eps 1e-5, weights drawn from
N(0, 0.02) with the two residual projections of each layer scaled by 1/sqrt(2 * num_layers).
Hugging Face's ``GPT2LMHeadModel`` stores each projection in a ``Conv1D``, whose weight is
``(in, out)``: the transpose of ``nn.Linear``'s ``(out, in)``. ``load_into_hf_gpt2`` and
``from_hf_gpt2`` port the weights both ways.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .attention import MultiHeadAttention
from .decoding import filter_logits, next_token
from .embeddings import TransformerEmbedding
from .layers import Encoder
from .masks import causal_mask
from .model import KVCache
from .modern import RMSNorm, swiglu_d_ff
from .rope import RotaryEmbedding
from .validation import check_ids, check_size, check_tensor

__all__ = ["GPTConfig", "GPT", "lm_loss", "hf_gpt2_config", "load_into_hf_gpt2", "from_hf_gpt2",
           "port_attention_reference"]


@dataclass
class GPTConfig:
    """The sizes of a GPT. Defaults: lesson 09's character model (4 layers, d_model 128, 4 heads,
    64 positions). ``d_ff`` None means ``4 * d_model`` (GPT-2), or ``swiglu_d_ff(d_model)`` (the
    same parameter count) with ``activation="swiglu"``.

    Lesson 11 changes the block one part at a time; the defaults are GPT-2's:

    - ``norm``: ``"layernorm"`` or ``"rmsnorm"``;
    - ``positional``: ``"learned"`` (added to the tokens), ``"sinusoidal"`` (added, lesson 03),
      ``"rope"`` (queries and keys turned in every layer, ``rope_base``) or ``"none"``;
    - ``activation``: ``"gelu_tanh"`` (GPT-2), ``"gelu"``, ``"relu"`` or ``"swiglu"``;
    - ``num_kv_heads``: grouped-query attention (None = ``num_heads``);
    - ``bias``: biases in the attention and feed-forward projections;
    - ``tie_embeddings``: the output layer reuses the token table;
    - ``attn_only``: no feed-forward sublayers (lesson 12's attention-only model, the one the
      Framework paper reads: every layer only adds its heads' outputs to the residual stream).

    ``GPTConfig.llama_style()`` switches them all to Llama's choices.
    """

    vocab_size: int = 83
    max_len: int = 64
    d_model: int = 128
    num_heads: int = 4
    num_layers: int = 4
    d_ff: int | None = None
    dropout: float = 0.0
    layer_norm_eps: float = 1e-5
    fused_attention: bool = False
    norm: str = "layernorm"
    positional: str = "learned"
    activation: str = "gelu_tanh"
    num_kv_heads: int | None = None
    bias: bool = True
    tie_embeddings: bool = True
    rope_base: float = 10000.0
    attn_only: bool = False

    def __post_init__(self) -> None:
        for name in ("vocab_size", "max_len", "d_model", "num_heads", "num_layers", "d_ff", "num_kv_heads"):
            if getattr(self, name) is not None or name not in ("d_ff", "num_kv_heads"):  # 64.0 -> 64
                setattr(self, name, check_size(getattr(self, name), name, "GPTConfig"))
        for name in ("bias", "tie_embeddings", "fused_attention", "attn_only"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"GPTConfig: {name} must be True or False, got {getattr(self, name)!r}")
        for name in ("layer_norm_eps", "rope_base"):  # 0 or less, NaN, inf: NaN or meaningless logits
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                    math.isfinite(value) and value > 0):
                raise ValueError(f"GPTConfig: {name} must be a finite number > 0, got {value!r}")
        if self.d_model % self.num_heads != 0:
            raise ValueError(
                f"GPTConfig: d_model={self.d_model} is not divisible by num_heads={self.num_heads}"
            )
        if self.num_kv_heads is None:
            self.num_kv_heads = self.num_heads
        if self.num_kv_heads < 1 or self.num_heads % self.num_kv_heads != 0:
            raise ValueError(
                f"GPTConfig: num_heads={self.num_heads} is not divisible by num_kv_heads="
                f"{self.num_kv_heads}; choose a divisor of num_heads (1 = multi-query attention)"
            )
        if self.positional not in POSITIONAL:
            raise ValueError(f"GPTConfig: positional must be one of {POSITIONAL}, got {self.positional!r}")
        if self.positional == "rope" and (self.d_model // self.num_heads) % 2 != 0:
            raise ValueError(
                f"GPTConfig: RoPE turns pairs of numbers, so head_dim = d_model // num_heads must be "
                f"even, got {self.d_model} // {self.num_heads} = {self.d_model // self.num_heads}"
            )
        if self.norm not in ("layernorm", "rmsnorm"):
            raise ValueError(f"GPTConfig: norm must be 'layernorm' or 'rmsnorm', got {self.norm!r}")
        if self.activation not in ("gelu_tanh", "gelu", "relu", "swiglu"):
            raise ValueError(
                "GPTConfig: activation must be 'gelu_tanh', 'gelu', 'relu' or 'swiglu', got "
                f"{self.activation!r}"
            )
        if self.d_ff is None:
            self.d_ff = swiglu_d_ff(self.d_model) if self.activation == "swiglu" else 4 * self.d_model
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, (int, float)) or not (
                0.0 <= self.dropout < 1.0):
            raise ValueError(f"GPTConfig: dropout must be in [0, 1), got {self.dropout}")

    @classmethod
    def gpt2_small(cls) -> "GPTConfig":
        """GPT-2 small: 12 layers, d_model 768, 12 heads, 1,024 positions, 50,257 tokens, dropout
        0.1; 124,439,808 parameters with tied embeddings."""
        return cls(vocab_size=50257, max_len=1024, d_model=768, num_heads=12, num_layers=12, dropout=0.1)

    @classmethod
    def llama_style(cls, **sizes) -> "GPTConfig":
        """Llama's block: RMSNorm (eps 1e-6), RoPE, SwiGLU, no biases, an untied output layer.
        ``sizes`` overrides any field (``num_kv_heads=2`` for grouped-query attention)."""
        llama = dict(norm="rmsnorm", positional="rope", activation="swiglu", bias=False,
                     tie_embeddings=False, layer_norm_eps=1e-6)
        return cls(**{**llama, **sizes})

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads


POSITIONAL = ("learned", "sinusoidal", "rope", "none")


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of the next token at every position.

    ``logits (B, T, V)``, ``targets (B, T)`` (the input moved on by one) -> scalar (nats per token).
    """
    check_tensor(logits, "lm_loss", "logits")
    check_tensor(targets, "lm_loss", "targets")
    if logits.dim() != 3 or targets.shape != logits.shape[:2]:
        raise ValueError(
            f"lm_loss: logits must be (B, T, V) and targets (B, T), got {tuple(logits.shape)} and "
            f"{tuple(targets.shape)}"
        )
    if not logits.dtype.is_floating_point:
        raise TypeError(f"lm_loss: logits must be a float tensor, got dtype {logits.dtype}")
    if targets.dtype.is_floating_point or targets.dtype.is_complex or targets.dtype == torch.bool:
        raise TypeError(
            f"lm_loss: targets must be integer token ids, got dtype {targets.dtype}; they are the "
            "next token at every position (the input moved on by one), not probabilities"
        )
    if targets.numel() == 0:
        raise ValueError(f"lm_loss: there are no targets, shape {tuple(targets.shape)}")
    targets = targets.long()  # any integer dtype
    counted = targets[targets != -100]  # -100: F.cross_entropy's ignore_index (lesson 11's copy task)
    if counted.numel() == 0:
        raise ValueError("lm_loss: every target is -100 (ignored), so there is no loss to average")
    if int(counted.min()) < 0 or int(counted.max()) >= logits.size(-1):
        raise ValueError(
            f"lm_loss: targets must lie in [0, {logits.size(-1) - 1}] (V={logits.size(-1)} logits) or "
            f"be -100 (ignored), got values from {int(counted.min())} to {int(counted.max())}"
        )
    if (logits.isnan() | logits.isposinf()).any():
        raise ValueError(
            "lm_loss: the logits contain NaN or +inf, so the loss would be NaN; the model's weights or "
            "input are not finite (did training diverge? lower the learning rate)"
        )
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))  # (B*T, V), (B*T,)


class _NoFeedForward(nn.Module):
    """The feed-forward sublayer of an attention-only model: adds nothing, ``(B, T, d) -> 0``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(x)


class GPT(nn.Module):
    """GPT-2's architecture from the course's parts. ``forward(ids (B, T)) -> logits (B, T, V)``.

    ``embed``: token + learned position vectors; ``blocks``: an ``Encoder`` of pre-LN layers with a
    causal mask and its final LayerNorm (GPT-2's ``ln_f``); ``lm_head``: tied to the token table.
    With ``GPTConfig.llama_style()`` the same class is lesson 11's Llama-style model: no position
    vectors (``rotary``, one table shared by every layer's attention), RMSNorm, SwiGLU, GQA.
    """

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = c = config
        added = c.positional if c.positional in ("learned", "sinusoidal") else "none"
        self.embed = TransformerEmbedding(
            c.vocab_size, c.d_model, c.max_len, positional=added, scale_embedding=False,
            dropout=c.dropout,
        )
        self.rotary = (RotaryEmbedding(c.head_dim, c.max_len, c.rope_base)
                       if c.positional == "rope" else None)
        self.blocks = Encoder(
            c.num_layers, c.d_model, c.num_heads, c.d_ff, dropout=c.dropout, activation=c.activation,
            norm_first=True, layer_norm_eps=c.layer_norm_eps, fused_attention=c.fused_attention,
            norm=c.norm, num_kv_heads=c.num_kv_heads, rotary=self.rotary, bias=c.bias,
        )
        if c.attn_only:  # x + feed_forward(norm2(x)) becomes x + 0: the same layers, no MLP
            for layer in self.blocks.layers:
                layer.feed_forward, layer.norm2 = _NoFeedForward(), nn.Identity()
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        if c.tie_embeddings:
            self.lm_head.weight = self.embed.token.embedding.weight  # tied: one (V, d_model) matrix
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """GPT-2's initialisation: every matrix N(0, 0.02), biases 0, LayerNorms (1, 0); the output
        projections of attention and feed-forward N(0, 0.02 / sqrt(2 * num_layers)), because each
        layer adds two of them to the residual stream. (The same for every block of lesson 11, so
        that a comparison changes one part and nothing else.)"""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, 0.0, 0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
            if isinstance(module, (nn.LayerNorm, RMSNorm)):
                nn.init.ones_(module.weight)
            if isinstance(module, nn.LayerNorm):
                nn.init.zeros_(module.bias)
        for layer in self.blocks.layers:
            outputs = [layer.self_attn.out_proj]
            if not self.config.attn_only:
                outputs.append(layer.feed_forward.linear2)
            for linear in outputs:
                nn.init.normal_(linear.weight, 0.0, 0.02 / math.sqrt(2 * self.config.num_layers))

    def _check(self, ids: torch.Tensor, where: str) -> torch.Tensor:
        """Checked ids as int64 (every integer dtype is accepted)."""
        ids = check_ids(ids, self.config.vocab_size, where)
        if ids.size(1) > self.config.max_len:
            raise ValueError(
                f"{where}: the input has {ids.size(1)} positions but the model has "
                f"max_len={self.config.max_len} positions; give it the last "
                f"{self.config.max_len} tokens (ids[:, -{self.config.max_len}:])"
            )
        return ids

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        ids = self._check(ids, "GPT")
        mask = causal_mask(ids.size(1), ids.device)  # (T, T): position t sees 0..t
        # is_causal: the mask IS causal, so the fused kernel (training) can skip reading it
        hidden = self.blocks(self.embed(ids), mask, is_causal=True)  # (B, T, d_model), after ln_f
        return self.lm_head(hidden)  # (B, T, V)

    # --- generation with lesson 07's KV cache ---

    def start_cache(self, batch_size: int) -> KVCache:
        """An empty cache: per layer ``self_k/v (B, h, 0, head_dim)``, no cross-attention."""
        like = self.lm_head.weight
        keep = torch.zeros(batch_size, 0, dtype=torch.bool, device=like.device)  # (B, 0)
        return KVCache(self.blocks.start_cache(batch_size, like), None, keep)

    def step(self, tokens: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Feed the token at position t = ``cache.length`` of every row, ``tokens (B,)``, and return
        the next-token logits ``(B, V)``: row t of ``forward`` on all t+1 tokens, from one position's
        work. Updates ``cache`` in place."""
        t = cache.length
        check_tensor(tokens, "GPT.step", "tokens")
        if tokens.dim() != 1 or tokens.size(0) != cache.tgt_keep.size(0):
            raise ValueError(
                f"GPT.step: tokens must be (B,) with B={cache.tgt_keep.size(0)}, got {tuple(tokens.shape)}"
            )
        if t >= self.config.max_len:
            raise ValueError(
                f"GPT.step: the cache already holds max_len={self.config.max_len} positions; there "
                "is no position for the next one (generate slides a window instead)"
            )
        tokens = self._check(tokens.unsqueeze(1), "GPT.step")[:, 0]  # (B,) int64
        x = self.embed.token(tokens.unsqueeze(1))  # (B, 1, d)
        if self.embed.position is not None:  # RoPE turns q and k inside the cache step instead
            x = x + self.embed.position(t + 1)[t:]  # (B, 1, d) + (1, d)
        x = self.embed.dropout(x)
        new = torch.ones(tokens.size(0), 1, dtype=torch.bool, device=tokens.device)  # no padding in a GPT
        cache.tgt_keep = torch.cat([cache.tgt_keep, new], dim=1)  # (B, t) -> (B, t+1)
        hidden = self.blocks.step(x, cache.layers, None)  # (B, 1, d): no mask, nothing later exists
        return self.lm_head(hidden[:, 0])  # (B, V)

    @torch.no_grad()
    def generate(
        self,
        ids: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        generator: torch.Generator | None = None,
        greedy: bool = False,
        use_cache: bool = True,
    ) -> torch.Tensor:
        """Continue ``ids (B, T)`` by ``max_new_tokens`` tokens; returns ``(B, T + max_new_tokens)``.

        Each next token is drawn from ``softmax(logits / temperature)`` after ``filter_logits``
        (top-k, nucleus), with ``generator`` for reproducible draws, or is the argmax if ``greedy``.
        With ``use_cache`` the prompt goes through once and each new token costs one position
        (lesson 07); it gives the same tokens as recomputing every step (``use_cache=False``). Once
        the text is longer than ``max_len``, both recompute the last ``max_len`` tokens each step: a
        cache cannot slide, because every cached key was computed at its old position.
        """
        ids = self._check(ids, "GPT.generate")  # (B, T) int64
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
            raise ValueError(f"GPT.generate: max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
        if not greedy and not (isinstance(temperature, (int, float)) and math.isfinite(temperature)
                               and temperature > 0):
            raise ValueError(f"GPT.generate: temperature must be a finite number > 0, got {temperature!r} "
                             "(greedy=True takes the argmax)")
        if not greedy:
            filter_logits(torch.zeros(1, 1), top_k, top_p)  # refuses a bad top_k / top_p before any work
        was_training = self.training
        self.eval()
        out, cache, logits = ids, None, None
        for _ in range(max_new_tokens):
            if use_cache and out.size(1) <= self.config.max_len:
                if cache is None:  # the prompt, one position at a time into the cache
                    cache = self.start_cache(out.size(0))
                    for t in range(out.size(1)):
                        logits = self.step(out[:, t], cache)
                else:
                    logits = self.step(out[:, -1], cache)
            else:
                logits = self(out[:, -self.config.max_len :])[:, -1]  # (B, V): recompute the window
            if not torch.isfinite(logits).all():
                self.train(was_training)
                raise ValueError("GPT.generate: the model's logits contain NaN or inf, so no token "
                                 "can be drawn; its weights are not finite (did training diverge?)")
            next_id = next_token(logits, temperature, top_k, top_p, generator, greedy)  # (B,)
            out = torch.cat([out, next_id.unsqueeze(1)], dim=1)
        self.train(was_training)
        return out


# --- Hugging Face's GPT2LMHeadModel, both ways ---


def _check_gpt2_style(config: GPTConfig, where: str) -> None:
    """GPT2LMHeadModel has one block: LayerNorm, learned positions, GELU (tanh), biases, tied, MHA."""
    wanted = dict(norm="layernorm", positional="learned", activation="gelu_tanh", bias=True,
                  tie_embeddings=True, num_kv_heads=config.num_heads, attn_only=False)
    wrong = {k: getattr(config, k, v) for k, v in wanted.items() if getattr(config, k, v) != v}
    if wrong:
        raise ValueError(
            f"{where}: GPT2LMHeadModel is GPT-2's block ({wanted}); this config has {wrong}. A "
            "Llama-style model ports with course_lib.llama; other blocks have no Hugging Face twin"
        )


def config_differences(pairs: list[tuple[str, object, object]]) -> list[str]:
    """``(field, ours, theirs)`` triples -> ``"field: ours vs theirs"`` for those that differ
    (floats compared to a relative 1e-9)."""
    def same(a, b) -> bool:
        if isinstance(a, float) or isinstance(b, float):
            return isinstance(b, (int, float)) and math.isclose(a, b, rel_tol=1e-9)
        return a == b
    return [f"{name}: {ours!r} vs {theirs!r}" for name, ours, theirs in pairs if not same(ours, theirs)]


def _gpt2_pairs(config: GPTConfig, c) -> list[tuple[str, object, object]]:
    """course_lib's fields against a ``GPT2Config``'s, one triple per field that shapes the model."""
    gelu_tanh = c.activation_function in ("gelu_new", "gelu_pytorch_tanh")
    return [
        ("num_layers / n_layer", config.num_layers, c.n_layer),
        ("num_heads / n_head", config.num_heads, c.n_head),
        ("d_model / n_embd", config.d_model, c.n_embd),
        ("d_ff / n_inner", config.d_ff, c.n_inner or 4 * c.n_embd),
        ("vocab_size", config.vocab_size, c.vocab_size),
        ("max_len / n_positions", config.max_len, c.n_positions),
        ("layer_norm_eps / layer_norm_epsilon", config.layer_norm_eps, c.layer_norm_epsilon),
        ("tie_embeddings / tie_word_embeddings", config.tie_embeddings, c.tie_word_embeddings),
        ("activation / activation_function", config.activation,
         "gelu_tanh" if gelu_tanh else c.activation_function),
        ("scaled scores / scale_attn_weights", True, c.scale_attn_weights),
        ("scores / scale_attn_by_inverse_layer_idx", False, c.scale_attn_by_inverse_layer_idx),
    ]


def _check_hf_gpt2(hf_model, where: str) -> None:
    from transformers import GPT2LMHeadModel

    if not isinstance(hf_model, GPT2LMHeadModel):
        raise TypeError(f"{where}: needs a transformers GPT2LMHeadModel, got {type(hf_model).__name__}")


def hf_gpt2_config(config: GPTConfig):
    """The ``transformers.GPT2Config`` of the same model (GELU tanh = "gelu_new", tied)."""
    from transformers import GPT2Config

    _check_gpt2_style(config, "hf_gpt2_config")
    return GPT2Config(
        vocab_size=config.vocab_size, n_positions=config.max_len, n_embd=config.d_model,
        n_layer=config.num_layers, n_head=config.num_heads, n_inner=config.d_ff,
        activation_function="gelu_new", resid_pdrop=config.dropout, embd_pdrop=config.dropout,
        attn_pdrop=config.dropout, layer_norm_epsilon=config.layer_norm_eps, tie_word_embeddings=True,
        bos_token_id=config.vocab_size - 1, eos_token_id=config.vocab_size - 1,  # GPT-2: the last id
    )


def _name_map(num_layers: int) -> dict[str, tuple[str, bool]]:
    """course_lib name -> (Hugging Face name, transposed?) for everything except q/k/v."""
    names = {
        "embed.token.embedding.weight": ("transformer.wte.weight", False),
        "embed.position.embedding.weight": ("transformer.wpe.weight", False),
        "blocks.norm.weight": ("transformer.ln_f.weight", False),
        "blocks.norm.bias": ("transformer.ln_f.bias", False),
    }
    for i in range(num_layers):
        ours, theirs = f"blocks.layers.{i}.", f"transformer.h.{i}."
        for a, b in (("norm1", "ln_1"), ("norm2", "ln_2")):
            names[ours + a + ".weight"] = (theirs + b + ".weight", False)
            names[ours + a + ".bias"] = (theirs + b + ".bias", False)
        for a, b in (("self_attn.out_proj", "attn.c_proj"), ("feed_forward.linear1", "mlp.c_fc"),
                     ("feed_forward.linear2", "mlp.c_proj")):
            names[ours + a + ".weight"] = (theirs + b + ".weight", True)  # Conv1D: (in, out)
            names[ours + a + ".bias"] = (theirs + b + ".bias", False)
    return names


@torch.no_grad()
def load_into_hf_gpt2(model: GPT, hf_model) -> None:
    """Copy ``model``'s weights into a ``GPT2LMHeadModel`` of the same shape, in place.

    ``nn.Linear`` stores ``(out, in)``, GPT-2's ``Conv1D`` ``(in, out)``: every matrix is
    transposed; the separate q, k, v projections become one ``c_attn`` of width ``3 * d_model``.
    """
    _check_gpt2_style(model.config, "load_into_hf_gpt2")
    _check_hf_gpt2(hf_model, "load_into_hf_gpt2")
    differences = config_differences(_gpt2_pairs(model.config, hf_model.config))
    if differences:  # same shapes can hide other heads or eps; more layers would stay random
        raise ValueError(
            "load_into_hf_gpt2: the Hugging Face model is not the same architecture (ours vs "
            f"theirs): {'; '.join(differences)}. Build it with "
            "GPT2LMHeadModel(hf_gpt2_config(model.config))"
        )
    ours = model.state_dict()
    theirs = hf_model.state_dict()
    for name, (hf_name, transposed) in _name_map(model.config.num_layers).items():
        tensor = ours[name].t() if transposed else ours[name]
        if theirs[hf_name].shape != tensor.shape:
            raise ValueError(f"load_into_hf_gpt2: {hf_name} is {tuple(theirs[hf_name].shape)}, "
                             f"course_lib's {name} gives {tuple(tensor.shape)}; build the Hugging "
                             "Face model from hf_gpt2_config(model.config)")
        theirs[hf_name].copy_(tensor)
    for i, layer in enumerate(model.blocks.layers):
        attn = layer.self_attn
        weight = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight], dim=0)  # (3d, d)
        theirs[f"transformer.h.{i}.attn.c_attn.weight"].copy_(weight.t())  # (d, 3d)
        bias = torch.cat([attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias])  # (3d,)
        theirs[f"transformer.h.{i}.attn.c_attn.bias"].copy_(bias)


@torch.no_grad()
def from_hf_gpt2(hf_model) -> GPT:
    """A course_lib ``GPT`` with the weights of a ``GPT2LMHeadModel`` (the reverse port)."""
    _check_hf_gpt2(hf_model, "from_hf_gpt2")
    c = hf_model.config
    if c.activation_function not in ("gelu_new", "gelu_pytorch_tanh"):
        raise ValueError(f"from_hf_gpt2: activation {c.activation_function!r} is not GELU's tanh form")
    config = GPTConfig(
        vocab_size=c.vocab_size, max_len=c.n_positions, d_model=c.n_embd, num_heads=c.n_head,
        num_layers=c.n_layer, d_ff=c.n_inner or 4 * c.n_embd, dropout=c.resid_pdrop,
        layer_norm_eps=c.layer_norm_epsilon,
    )
    differences = config_differences(_gpt2_pairs(config, c))
    if differences:  # what GPTConfig cannot express: an untied head, other attention scaling
        raise ValueError(f"from_hf_gpt2: course_lib's GPT cannot be this model (ours vs theirs): "
                         f"{'; '.join(differences)}")
    model = GPT(config)
    ours = model.state_dict()
    theirs = hf_model.state_dict()
    for name, (hf_name, transposed) in _name_map(config.num_layers).items():
        ours[name].copy_(theirs[hf_name].t() if transposed else theirs[hf_name])
    d = config.d_model
    for i, layer in enumerate(model.blocks.layers):
        w = theirs[f"transformer.h.{i}.attn.c_attn.weight"].t()  # (d, 3d) -> (3d, d)
        b = theirs[f"transformer.h.{i}.attn.c_attn.bias"]  # (3d,)
        for j, proj in enumerate((layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj)):
            proj.weight.copy_(w[j * d : (j + 1) * d])
            proj.bias.copy_(b[j * d : (j + 1) * d])
    return model.eval()


@torch.no_grad()
def port_attention_reference(ours: MultiHeadAttention, theirs) -> None:
    """course_lib's port of one attention layer into a Hugging Face ``GPT2Attention`` (what
    ``load_into_hf_gpt2`` does for every layer); lesson 09 uses it until the learner's passes
    ``check_attention_port``. ``Conv1D`` stores its weight as ``(in, out)``: every matrix is
    transposed, and q, k, v become one ``c_attn`` of width ``3 * d_model``."""
    d = ours.d_model
    W = torch.cat([ours.q_proj.weight, ours.k_proj.weight, ours.v_proj.weight], dim=0)  # (3d, d)
    theirs.c_attn.weight.copy_(W.t())  # Conv1D: (in, out) = (d, 3d)
    theirs.c_attn.bias.copy_(torch.cat([ours.q_proj.bias, ours.k_proj.bias, ours.v_proj.bias]))
    theirs.c_proj.weight.copy_(ours.out_proj.weight.t())  # (d, d)
    theirs.c_proj.bias.copy_(ours.out_proj.bias)
    assert theirs.c_attn.weight.shape == (d, 3 * d)
