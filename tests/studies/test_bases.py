"""The stored bases of lessons 15 and 16 (``make bases``): the files are the ones the code names by
sha256, hold the recipe and float path they were trained with, load as the lessons need them, and a
missing or changed file is refused with a message that says what to run. Fast: nothing trains here
(tests/studies/test_bases_training.py trains them again)."""

from __future__ import annotations

import shutil
from dataclasses import asdict, replace

import pytest
import torch

from course_lib.chat import SPECIAL_TOKENS
from course_lib.gpt import GPT, GPTConfig
from course_lib.lm_training import COURSE
from course_lib.studies import finetuning, instruct
from course_lib.studies.finetuning import (BASE_FILE, BASE_FLOAT_PATH, BASE_SHA256, file_sha256, load_base,
                                           load_model_file, save_model_file)
from course_lib.studies.instruct import (CHAT_BASE_FILE, CHAT_BASE_FLOAT_PATH, CHAT_BASE_SHA256, MAX_LEN,
                                         load_chat_base)

STORED = [(BASE_FILE, BASE_SHA256, BASE_FLOAT_PATH, "train_base(seed=0)", COURSE),
          (CHAT_BASE_FILE, CHAT_BASE_SHA256, CHAT_BASE_FLOAT_PATH, "train_chat_base(seed=0)",
           replace(COURSE, block_size=MAX_LEN))]
LOADERS = [(load_base, BASE_FILE, BASE_SHA256), (load_chat_base, CHAT_BASE_FILE, CHAT_BASE_SHA256)]
NAMES = ["load_base", "load_chat_base"]
PLAYS = object()  # stands for the plays corpus, which takes seconds to read (the notebooks read it)


@pytest.fixture(autouse=True)
def no_corpus(monkeypatch):
    monkeypatch.setattr(finetuning, "corpora", lambda: (PLAYS, None))


@pytest.mark.parametrize("path, sha, float_path, function, recipe", STORED, ids=["base", "chat_base"])
def test_each_stored_file_is_the_one_the_code_names_and_says_how_it_was_trained(path, sha, float_path,
                                                                                function, recipe):
    assert file_sha256(path) == sha
    config, state_dict, meta = load_model_file(path, sha, "bases", "test")
    assert meta["function"] == function and meta["seed"] == 0
    assert meta["float_path"] == float_path and meta["threads"] == 1
    assert meta["recipe"] == asdict(recipe) and meta["steps"] == recipe.num_steps == 700
    assert meta["torch"][:1].isdigit()
    assert config.max_len == recipe.block_size and config.num_layers == recipe.num_layers
    assert path.stat().st_size < 1_000_000  # float32 weights of about 220,000 parameters


def test_load_base_gives_the_lessons_model_and_the_plays():
    model, corpus = load_base()
    assert isinstance(model, GPT) and not model.training and corpus is PLAYS  # corpora()'s plays
    assert model.config.vocab_size == 83  # the plays' characters and model.config.max_len == COURSE.block_size
    assert sum(p.numel() for p in model.parameters()) == 217_344  # the count lesson 15 prints
    assert model.lm_head.weight is model.embed.token.embedding.weight  # still tied after loading


def test_load_chat_base_gives_the_grown_model_with_its_mean_rows():
    model = load_chat_base()
    V = 83  # the plays' characters; the template's three ids follow
    assert not model.training and model.config.vocab_size == V + len(SPECIAL_TOKENS)
    assert model.config.max_len == MAX_LEN
    table = model.embed.token.embedding.weight  # (V + 3, d_model)
    assert model.lm_head.weight is table
    assert torch.allclose(table[V:], table[:V].mean(0).expand(len(SPECIAL_TOKENS), -1))


@pytest.mark.parametrize("load, path, sha", LOADERS, ids=NAMES)
def test_a_missing_file_is_refused_with_what_to_run(tmp_path, load, path, sha):
    with pytest.raises(FileNotFoundError, match=r"is missing; run `make bases`"):
        load(tmp_path / path.name)


@pytest.mark.parametrize("load, path, sha", LOADERS, ids=NAMES)
def test_a_changed_file_is_refused_with_what_to_run(tmp_path, load, path, sha):
    changed = tmp_path / path.name
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 1  # one bit of one weight
    changed.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"is not the stored model .* run `make bases`"):
        load(changed)
    shutil.copyfile(path, changed)  # the same bytes under another name load
    load(changed)


@pytest.mark.parametrize("module, file, load", [(finetuning, "BASE_FILE", load_base),
                                                (instruct, "CHAT_BASE_FILE", load_chat_base)], ids=NAMES)
def test_the_default_file_is_checked_too(monkeypatch, tmp_path, module, file, load):
    stored = getattr(module, file)
    monkeypatch.setattr(module, file, tmp_path / stored.name)  # a clone without the file
    with pytest.raises(FileNotFoundError, match=r"is missing; run `make bases`"):
        load()
    (tmp_path / stored.name).write_bytes(stored.read_bytes()[:-100])  # a partial download
    with pytest.raises(ValueError, match=r"is not the stored model .* run `make bases`"):
        load()
    shutil.copyfile(stored, tmp_path / stored.name)
    load()


def test_a_model_file_holds_its_config_weights_and_notes_and_its_bytes_do_not_depend_on_the_name(tmp_path):
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=11, max_len=8, d_model=16, num_heads=2, num_layers=1)).eval()
    sha = save_model_file(model, tmp_path / "a.pt", seed=3, recipe={"steps": 5}, float_path="x")
    assert save_model_file(model, tmp_path / "sub" / "b.pt", seed=3, recipe={"steps": 5}, float_path="x") == sha
    config, state_dict, meta = load_model_file(tmp_path / "a.pt", sha, "bases", "test")
    assert config == model.config and meta == {"seed": 3, "recipe": {"steps": 5}, "float_path": "x"}
    assert all(torch.equal(state_dict[k], v) for k, v in model.state_dict().items())
