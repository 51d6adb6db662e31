"""The full Transformer: configuration, encoder-decoder, encoder-only model and classifier.

``TransformerConfig`` holds every size and switch. The paper's base model is
``TransformerConfig.paper_base()``; a BERT-style encoder is the same classes with learned
positions, segment embeddings, an embedding LayerNorm and GELU (see ``course_lib.pretrained``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from .embeddings import TransformerEmbedding
from .layers import Decoder, Encoder, LayerKVCache
from .masks import decoder_self_attention_mask, padding_mask
from .tracing import trace
from .validation import check_size, check_tensor

__all__ = [
    "TransformerConfig",
    "Transformer",
    "KVCache",
    "TransformerEncoderModel",
    "TransformerClassifier",
    "init_xavier_",
    "count_parameters",
]


@dataclass
class TransformerConfig:
    """All hyper-parameters of the model. Defaults: a small model that learns the copy task fast.

    ``tie_embeddings``: ``"none"``; ``"decoder"`` (target embedding = output projection);
    ``"all"`` (source embedding = target embedding = output projection, paper section 3.4;
    needs ``src_vocab_size == tgt_vocab_size``).
    ``fused_attention``: every ``MultiHeadAttention`` uses PyTorch's fused kernel when no weights
    are asked for (faster, same result; ``attn_weights`` is then None). See ``set_fused_attention``.
    """

    src_vocab_size: int = 11
    tgt_vocab_size: int = 11
    d_model: int = 64
    num_heads: int = 4
    num_encoder_layers: int = 2
    num_decoder_layers: int = 2
    d_ff: int = 128
    dropout: float = 0.0
    activation: str = "relu"
    norm_first: bool = False
    layer_norm_eps: float = 1e-5
    max_len: int = 64
    positional: str = "sinusoidal"
    scale_embedding: bool = True
    num_segments: int = 0
    embedding_norm: bool = False
    tie_embeddings: str = "none"
    pad_id: int = 0
    bias: bool = True
    fused_attention: bool = False

    def __post_init__(self) -> None:
        for name, minimum in SIZE_FIELDS.items():  # 64.0 -> 64; 42.5, "64", True -> an error
            setattr(self, name, check_size(getattr(self, name), name, "TransformerConfig", minimum))
        if not (isinstance(self.layer_norm_eps, (int, float)) and math.isfinite(self.layer_norm_eps)
                and self.layer_norm_eps > 0):
            raise ValueError(f"TransformerConfig: layer_norm_eps must be a finite number > 0, got "
                             f"{self.layer_norm_eps!r}")
        if self.d_model % self.num_heads != 0:
            raise ValueError(
                f"TransformerConfig: d_model={self.d_model} is not divisible by num_heads={self.num_heads}"
            )
        if self.tie_embeddings not in ("none", "decoder", "all"):
            raise ValueError(f"TransformerConfig: tie_embeddings must be 'none', 'decoder' or 'all', got {self.tie_embeddings!r}")
        if self.tie_embeddings == "all" and self.src_vocab_size != self.tgt_vocab_size:
            raise ValueError(
                "TransformerConfig: tie_embeddings='all' needs one shared vocabulary, got "
                f"src_vocab_size={self.src_vocab_size} and tgt_vocab_size={self.tgt_vocab_size}"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"TransformerConfig: dropout must be in [0, 1), got {self.dropout}")
        if not 0 <= self.pad_id < min(self.src_vocab_size, self.tgt_vocab_size):
            raise ValueError(f"TransformerConfig: pad_id={self.pad_id} is outside the vocabulary")

    @classmethod
    def paper_base(cls, vocab_size: int = 37000) -> "TransformerConfig":
        """The base model of Vaswani et al. (2017), Table 3: N=6, d_model 512, d_ff 2048, h 8,
        dropout 0.1, one shared vocabulary and three-way tied embeddings."""
        return cls(
            src_vocab_size=vocab_size, tgt_vocab_size=vocab_size, d_model=512, num_heads=8,
            num_encoder_layers=6, num_decoder_layers=6, d_ff=2048, dropout=0.1, max_len=512,
            tie_embeddings="all",
        )

    def layer_kwargs(self) -> dict:
        """Keyword arguments shared by ``Encoder``, ``Decoder`` and their layers."""
        return dict(
            dropout=self.dropout, activation=self.activation, norm_first=self.norm_first,
            layer_norm_eps=self.layer_norm_eps, bias=self.bias,
            fused_attention=self.fused_attention,
        )

    def embedding(self, vocab_size: int) -> TransformerEmbedding:
        """An embedding layer built from this configuration."""
        return TransformerEmbedding(
            vocab_size, self.d_model, self.max_len, positional=self.positional,
            scale_embedding=self.scale_embedding, num_segments=self.num_segments,
            layer_norm=self.embedding_norm, layer_norm_eps=self.layer_norm_eps, dropout=self.dropout,
        )


# TransformerConfig's sizes and their smallest values (an encoder-only model has 0 decoder layers)
SIZE_FIELDS = dict(src_vocab_size=1, tgt_vocab_size=1, d_model=1, num_heads=1, num_encoder_layers=0,
                   num_decoder_layers=0, d_ff=1, max_len=1, num_segments=0, pad_id=0)


def init_xavier_(model: nn.Module) -> nn.Module:
    """Xavier-uniform init of every weight matrix (dim > 1) of *this* model, in place."""
    for p in model.parameters():
        if p.dim() > 1:
            nn.init.xavier_uniform_(p)
    return model


def count_parameters(model: nn.Module) -> int:
    """Number of distinct trainable parameters (a tied matrix counts once)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def _check_ids_pair(src: torch.Tensor, tgt: torch.Tensor) -> None:
    check_tensor(src, "Transformer", "src")
    check_tensor(tgt, "Transformer", "tgt")
    if src.dim() != 2 or tgt.dim() != 2:
        raise ValueError(f"Transformer: src and tgt must be (B, L) ids, got {tuple(src.shape)} and {tuple(tgt.shape)}")
    if src.size(0) != tgt.size(0):
        raise ValueError(
            f"Transformer: src and tgt must have the same batch size, got {src.size(0)} and {tgt.size(0)}"
        )


@dataclass
class KVCache:
    """Everything the decoder keeps between generation steps (lesson 07).

    layers:      one ``LayerKVCache`` per decoder layer (self-attention keys/values that grow by one
                 row per step; cross-attention keys/values of the memory, computed once).
    memory_mask: the source padding mask ``(B, 1, L_s)``, or None.
    tgt_keep:    bool ``(B, t)``: True where a decoded token is not padding, i.e. the keys a new
                 position may attend to (what ``decoder_self_attention_mask`` hides, step by step).
    """

    layers: list[LayerKVCache]
    memory_mask: torch.Tensor | None
    tgt_keep: torch.Tensor

    @property
    def length(self) -> int:
        """t, the number of positions decoded so far (the next one gets position t)."""
        return self.tgt_keep.size(1)

    def reorder(self, index: torch.Tensor) -> "KVCache":
        """Keep batch rows ``index`` (B_new,), in that order (beam search follows its beams)."""
        mask = self.memory_mask.index_select(0, index) if self.memory_mask is not None else None
        layers = [c.reorder(index) for c in self.layers]
        return KVCache(layers, mask, self.tgt_keep.index_select(0, index))


class Transformer(nn.Module):
    """Encoder-decoder Transformer (the paper's Figure 1).

    ``forward(src (B, L_s), tgt (B, L_t)) -> logits (B, L_t, tgt_vocab_size)``, where ``tgt`` is the
    decoder input (start symbol + target shifted right). Masks default to: source padding for the
    encoder and cross-attention, padding AND causal for decoder self-attention (pad = ``config.pad_id``).

    The weights are Xavier-initialized in ``__init__``: the model you train is the one initialized.
    """

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.config = config
        c = config
        self.src_embed = c.embedding(c.src_vocab_size)
        self.tgt_embed = c.embedding(c.tgt_vocab_size)
        self.encoder = Encoder(c.num_encoder_layers, c.d_model, c.num_heads, c.d_ff, **c.layer_kwargs())
        self.decoder = Decoder(c.num_decoder_layers, c.d_model, c.num_heads, c.d_ff, **c.layer_kwargs())
        self.generator = nn.Linear(c.d_model, c.tgt_vocab_size)
        init_xavier_(self)
        if c.tie_embeddings in ("decoder", "all"):
            self.generator.weight = self.tgt_embed.token.embedding.weight
        if c.tie_embeddings == "all":
            self.src_embed.token.embedding.weight = self.tgt_embed.token.embedding.weight

    def encode(self, src: torch.Tensor, src_mask: torch.Tensor | None = None) -> torch.Tensor:
        """``src (B, L_s) -> memory (B, L_s, d_model)``; ``src_mask`` defaults to the padding mask."""
        check_tensor(src, "Transformer.encode", "src")
        if src_mask is None:
            src_mask = padding_mask(src, self.config.pad_id)
        memory = self.encoder(self.src_embed(src), src_mask)
        trace("Transformer", "memory", memory)
        return memory

    def decode(
        self,
        tgt: torch.Tensor,
        memory: torch.Tensor,
        src_mask: torch.Tensor | None,
        tgt_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``tgt (B, L_t), memory (B, L_s, d) -> hidden (B, L_t, d_model)`` (before the output layer).

        ``src_mask`` is the source padding mask ``(B, 1, L_s)``: pass the one used in ``encode``.
        It has no default on purpose: forgetting it lets cross-attention read the source's padding,
        a bug that changes outputs only when a batch is padded. Pass ``None`` explicitly only when
        no source is padded. ``tgt_mask`` defaults to padding AND causal.
        """
        check_tensor(tgt, "Transformer.decode", "tgt")
        if tgt.size(0) != memory.size(0):
            raise ValueError(
                f"Transformer.decode: tgt and memory must have the same batch size, got {tgt.size(0)} and {memory.size(0)}"
            )
        if tgt_mask is None:
            tgt_mask = decoder_self_attention_mask(tgt, self.config.pad_id)
        return self.decoder(self.tgt_embed(tgt), memory, tgt_mask, src_mask)

    def start_cache(self, memory: torch.Tensor, src_mask: torch.Tensor | None) -> KVCache:
        """A cache for generating from ``memory (B, L_s, d_model)``: nothing decoded yet, and
        every decoder layer's cross-attention keys and values computed once. ``src_mask`` as in
        ``decode``."""
        B = memory.size(0)
        keep = torch.zeros(B, 0, dtype=torch.bool, device=memory.device)  # (B, 0): no position yet
        return KVCache(self.decoder.start_cache(memory), src_mask, keep)

    def decode_step(self, tokens: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Feed one new token per row and return the next-token logits, reusing the cache.

        Args:
            tokens: ``(B,)`` the token at position t = ``cache.length`` (first: the start symbol).
            cache: from ``start_cache``; updated in place (one more row of keys and values).

        Returns:
            logits ``(B, tgt_vocab_size)``, equal (to float precision) to the last position of
            ``generator(decode(all t+1 tokens, memory, src_mask))``; the work is one position.
        """
        check_tensor(tokens, "Transformer.decode_step", "tokens")
        if tokens.dim() != 1 or tokens.size(0) != cache.tgt_keep.size(0):
            raise ValueError(
                f"Transformer.decode_step: tokens must be (B,) with B={cache.tgt_keep.size(0)}, "
                f"got {tuple(tokens.shape)}"
            )
        t = cache.length
        emb = self.tgt_embed  # embed one token at position t (the full sequence would use 0..t)
        x = emb.token(tokens.unsqueeze(1)) + emb.position(t + 1)[t:]  # (B, 1, d) + (1, d)
        if emb.norm is not None:
            x = emb.norm(x)
        x = emb.dropout(x)
        keep = (tokens != self.config.pad_id).unsqueeze(1)  # (B, 1): a pad token is never a key
        cache.tgt_keep = torch.cat([cache.tgt_keep, keep], dim=1)  # (B, t+1)
        self_mask = cache.tgt_keep.unsqueeze(1)  # (B, 1, t+1): the new query sees every non-pad
        hidden = self.decoder.step(x, cache.layers, self_mask, cache.memory_mask)  # (B, 1, d_model)
        return self.generator(hidden[:, 0])  # (B, tgt_vocab_size)

    def forward(
        self,
        src: torch.Tensor,
        tgt: torch.Tensor,
        src_mask: torch.Tensor | None = None,
        tgt_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        _check_ids_pair(src, tgt)
        if src_mask is None:
            src_mask = padding_mask(src, self.config.pad_id)
        memory = self.encode(src, src_mask)
        logits = self.generator(self.decode(tgt, memory, src_mask, tgt_mask))
        trace("Transformer", "logits", logits)
        return logits  # (B, L_t, tgt_vocab_size)


class TransformerEncoderModel(nn.Module):
    """Encoder-only model (BERT-style): embeddings + encoder stack, uses ``config.src_vocab_size``.

    ``forward(ids (B, L), attention_mask (B, L) of 0/1 or bool | None, token_type_ids | None)
    -> hidden states (B, L, d_model)``; ``attention_mask`` defaults to ``ids != pad_id``.
    """

    def __init__(self, config: TransformerConfig, init: bool = True) -> None:
        super().__init__()
        self.config = config
        self.embed = config.embedding(config.src_vocab_size)
        self.encoder = Encoder(
            config.num_encoder_layers, config.d_model, config.num_heads, config.d_ff, **config.layer_kwargs()
        )
        if init:
            init_xavier_(self)

    def forward(
        self,
        ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        check_tensor(ids, "TransformerEncoderModel", "ids")
        if attention_mask is None:
            mask = padding_mask(ids, self.config.pad_id)
        else:
            if attention_mask.shape != ids.shape:
                raise ValueError(
                    f"TransformerEncoderModel: attention_mask must have the shape of ids {tuple(ids.shape)}, "
                    f"got {tuple(attention_mask.shape)}"
                )
            mask = attention_mask.bool().unsqueeze(1)  # (B, L) -> (B, 1, L): the keys each query may see
        return self.encoder(self.embed(ids, token_type_ids), mask)


class TransformerClassifier(nn.Module):
    """Encoder-only model with a classification head on the first position (BERT's [CLS]).

    ``forward(ids (B, L), ...) -> logits (B, num_classes)``.
    """

    def __init__(self, config: TransformerConfig, num_classes: int) -> None:
        super().__init__()
        if num_classes < 2:
            raise ValueError(f"TransformerClassifier: num_classes must be >= 2, got {num_classes}")
        self.encoder = TransformerEncoderModel(config)
        self.dropout = nn.Dropout(config.dropout)
        self.head = nn.Linear(config.d_model, num_classes)

    def forward(
        self,
        ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        hidden = self.encoder(ids, attention_mask, token_type_ids)  # (B, L, d_model)
        return self.head(self.dropout(hidden[:, 0]))  # first position -> (B, num_classes)
