"""Lesson 10 trains lesson 09's GPT on BPE tokens: ShakespeareCorpus takes any tokenizer."""

from __future__ import annotations

from course_lib.data.shakespeare import Play, ShakespeareCorpus


def test_a_corpus_in_bpe_tokens_trains_and_samples():
    """Lesson 10 trains lesson 09's GPT on BPE tokens: the corpus takes any tokenizer."""
    from course_lib.lm_training import LMRecipe, sample_text, train_lm
    from course_lib.tokenization import BPETokenizer

    text = "to be, or not to be, that is the question.\n" * 30
    tok = BPETokenizer.train(text, 270)
    corpus = ShakespeareCorpus(validation_plays=("B",), plays=[Play("A", "a", text), Play("B", "b", text)],
                               tokenizer=tok)
    assert corpus.vocab is tok and corpus.val_chars_per_token > 1.5
    assert tok.decode(corpus.train_ids.tolist()) == corpus.train_text
    assert "token ids" in repr(corpus)
    recipe = LMRecipe(num_layers=1, num_heads=2, d_model=16, block_size=8, batch_size=4, num_steps=3,
                      warmup=1)
    run = train_lm(corpus, recipe, progress=False, val_windows=4)
    assert isinstance(sample_text(run.model, corpus, "to be", 5), str)
