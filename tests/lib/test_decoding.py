"""greedy_decode, beam_search and sample: the KV cache, lesson 07's proofs, and bad arguments."""

import itertools

import pytest
import torch
from _helpers import assert_close, seeded  # noqa: F401  (seeded: autouse fixture)

from course_lib import Transformer, TransformerConfig, padding_mask
from course_lib.decoding import (
    beam_search,
    filter_logits,
    greedy_decode,
    length_penalty_factor,
    sample,
)

PAD, SOS, EOS = 0, 1, 2


def _model(norm_first: bool, vocab: int = 12, positional: str = "sinusoidal", **kw) -> Transformer:
    config = TransformerConfig(
        src_vocab_size=vocab,
        tgt_vocab_size=vocab,
        d_model=32,
        num_heads=4,
        d_ff=64,
        num_encoder_layers=2,
        num_decoder_layers=2,
        norm_first=norm_first,
        positional=positional,
        **kw,
    )
    model = Transformer(config).eval()
    with torch.no_grad():  # larger logits than Xavier's, so that argmaxes are not near-ties
        model.generator.weight.mul_(4.0)
    return model


def _padded_src(vocab: int = 12) -> torch.Tensor:
    src = torch.randint(3, vocab, (4, 7))
    src[1, 4:] = PAD
    src[2, 1:] = PAD  # a one-token source
    return src


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("positional", ["sinusoidal", "learned"])
def test_cached_logits_equal_uncached_at_every_step(norm_first, positional):
    model = _model(norm_first, positional=positional)
    src = _padded_src()
    src_mask = padding_mask(src, PAD)
    tgt = torch.cat([torch.full((4, 1), SOS), torch.randint(3, 12, (4, 9))], dim=1)
    tgt[3, 5] = PAD  # a padded decoder input is hidden in both paths
    with torch.no_grad():
        memory = model.encode(src, src_mask)
        full = model.generator(model.decode(tgt, memory, src_mask))  # (B, L_t, V), one pass
        cache = model.start_cache(memory, src_mask)
        for t in range(tgt.size(1)):
            step = model.decode_step(tgt[:, t], cache)
            assert cache.length == t + 1
            assert cache.layers[0].self_k.shape == (4, 4, t + 1, 8)  # one more row per step
            assert cache.layers[0].cross_k.shape == (4, 4, 7, 8)  # the memory's, fixed
            uncached = model.generator(model.decode(tgt[:, : t + 1], memory, src_mask))[:, -1]
            assert_close(step, uncached)
            assert_close(step, full[:, t])


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("end_id", [None, EOS])
def test_greedy_same_tokens_with_and_without_cache(norm_first, end_id):
    model = _model(norm_first)
    src = _padded_src()
    with_cache = greedy_decode(model, src, 12, SOS, end_id)
    without = greedy_decode(model, src, 12, SOS, end_id, use_cache=False)
    assert with_cache.shape == (4, 12)
    assert torch.equal(with_cache, without)


def test_greedy_end_id_fills_the_rest_and_stops_early():
    model = _model(False)
    with torch.no_grad():  # make <eos> the most likely token everywhere
        model.generator.bias.zero_()
        model.generator.bias[EOS] = 1e4
    out = greedy_decode(model, _padded_src(), 10, SOS, EOS)
    assert (out == EOS).all()


def test_greedy_end_id_row_stays_finished():
    model = _model(True)
    src = _padded_src()
    free = greedy_decode(model, src, 10, SOS)
    end_id = int(free[0, 2])  # a token row 0 produces at step 2
    out = greedy_decode(model, src, 10, SOS, end_id)
    for row in out:
        hits = (row == end_id).nonzero()
        if len(hits):
            assert (row[hits[0, 0] :] == end_id).all()


def test_source_mask_matters():
    """With the source mask, extra padding changes nothing; without it, padding is attended to."""
    model = _model(False)
    src = _padded_src()
    longer = torch.cat([src, torch.full((4, 5), PAD)], dim=1)  # the same sequences, more padding
    assert torch.equal(greedy_decode(model, src, 8, SOS), greedy_decode(model, longer, 8, SOS))

    def first_logits(ids, mask):
        with torch.no_grad():
            cache = model.start_cache(model.encode(ids, mask), mask)
            return model.decode_step(torch.full((4,), SOS), cache)

    no_mask = torch.ones(4, 1, longer.size(1), dtype=torch.bool)  # the bug: every key visible
    assert_close(
        first_logits(longer, padding_mask(longer, PAD)), first_logits(src, padding_mask(src, PAD))
    )
    assert not torch.allclose(
        first_logits(longer, no_mask), first_logits(src, padding_mask(src, PAD))
    )


@pytest.mark.parametrize("norm_first", [False, True])
def test_beam_of_one_is_greedy(norm_first):
    model = _model(norm_first)
    src = _padded_src()
    tokens, scores = beam_search(model, src, 10, SOS, EOS, beam_size=1)
    assert torch.equal(tokens, greedy_decode(model, src, 10, SOS, EOS))
    assert scores.shape == (4,)


def _exhaustive_best(model, src_row, max_len, alpha):
    """Score every possible output of at most max_len tokens (ending at the first <eos>), over the
    tokens beam search may generate (not <pad>, not <sos>), with one batched full forward pass."""
    vocab = model.config.tgt_vocab_size
    allowed = [t for t in range(vocab) if t not in (PAD, SOS)]
    outputs = sorted(
        {seq[: seq.index(EOS) + 1] if EOS in seq else seq
         for seq in itertools.product(allowed, repeat=max_len)}
    )
    # (N, 1 + max_len): <sos>, the output, <eos> as filler (the causal mask hides it from the output)
    tgt = torch.tensor([[SOS, *seq] + [EOS] * (max_len - len(seq)) for seq in outputs])
    with torch.no_grad():
        logp = model(src_row.expand(len(outputs), -1), tgt[:, :-1]).log_softmax(-1)  # (N, L, V)
    token_logp = logp.gather(2, tgt[:, 1:].unsqueeze(2)).squeeze(2)  # (N, max_len)
    lengths = torch.tensor([len(seq) for seq in outputs])
    real = torch.arange(max_len) < lengths.unsqueeze(1)
    scores = (token_logp * real).sum(1) / length_penalty_factor(lengths.double(), alpha)
    best = int(scores.argmax())
    return scores[best].item(), list(outputs[best])


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0])
def test_wide_beam_is_exhaustive(norm_first, alpha):
    vocab, max_len = 6, 3  # <eos> and 3 symbols: 1 + 3 + 9 + 27 = 40 outputs of at most 3 tokens
    model = _model(norm_first, vocab=vocab)
    with torch.no_grad():
        model.generator.weight.mul_(0.25)  # back to flatter distributions: many close competitors
        model.generator.bias[EOS] += 1.0  # outputs that end at different lengths
    src = torch.tensor([[3, 3, 3], [3, 0, 0]])
    tokens, scores = beam_search(model, src, max_len, SOS, EOS, beam_size=40, length_penalty=alpha)
    for b in range(2):
        best, best_seq = _exhaustive_best(model, src[b], max_len, alpha)
        assert scores[b].item() == pytest.approx(best, abs=1e-5)
        assert tokens[b, : len(best_seq)].tolist() == best_seq


def test_wide_beam_follows_the_length_normalisation():
    """Lesson 07's case: winners end with <eos> at different lengths, and alpha changes one."""
    torch.manual_seed(2)
    tiny = Transformer(
        TransformerConfig(src_vocab_size=6, tgt_vocab_size=6, d_model=16, num_heads=2, d_ff=32)
    ).eval()
    with torch.no_grad():
        tiny.generator.bias[EOS] += 2.0
    src = torch.tensor([[3, 4, 5, 4], [5, 3, PAD, PAD]])
    winners = {}
    for alpha in (0.0, 0.6):
        tokens, scores = beam_search(tiny, src, 4, SOS, EOS, beam_size=121, length_penalty=alpha)
        for b in range(2):
            best, best_seq = _exhaustive_best(tiny, src[b], 4, alpha)
            assert tokens[b, : len(best_seq)].tolist() == best_seq
            assert scores[b].item() == pytest.approx(best, abs=1e-5)
            winners[alpha, b] = best_seq
    assert all(seq[-1] == EOS and len(seq) < 4 for seq in winners.values())
    assert len(winners[0.0, 1]) < len(winners[0.6, 1])


def test_beam_never_scores_below_greedy():
    model = _model(False)
    src = _padded_src()
    for k in (2, 4, 8):
        _, scores = beam_search(model, src, 8, SOS, EOS, beam_size=k, length_penalty=0.0)
        _, greedy_scores = beam_search(model, src, 8, SOS, EOS, beam_size=1, length_penalty=0.0)
        assert (scores >= greedy_scores - 1e-5).all()


def test_top_k_one_and_tiny_temperature_are_greedy():
    model = _model(True)
    src = _padded_src()
    greedy = greedy_decode(model, src, 10, SOS, EOS)
    gen = torch.Generator().manual_seed(0)
    assert torch.equal(sample(model, src, 10, SOS, EOS, top_k=1, generator=gen), greedy)
    assert torch.equal(sample(model, src, 10, SOS, EOS, temperature=1e-4, generator=gen), greedy)
    assert torch.equal(sample(model, src, 10, SOS, EOS, top_p=1e-6, generator=gen), greedy)


def test_sample_is_reproducible_with_a_seeded_generator():
    model = _model(False)
    src = _padded_src()
    a = sample(
        model, src, 10, SOS, EOS, temperature=2.0, generator=torch.Generator().manual_seed(3)
    )
    b = sample(
        model, src, 10, SOS, EOS, temperature=2.0, generator=torch.Generator().manual_seed(3)
    )
    c = sample(
        model, src, 10, SOS, EOS, temperature=2.0, generator=torch.Generator().manual_seed(4)
    )
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_filter_logits():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    assert torch.isinf(filter_logits(logits, top_k=2)).tolist() == [[False, False, True, True]]
    assert torch.isinf(filter_logits(logits, top_p=0.75)).tolist() == [[False, False, True, True]]
    assert torch.isinf(filter_logits(logits, top_p=0.85)).tolist() == [[False, False, False, True]]
    assert torch.isinf(filter_logits(logits, top_p=0.1)).tolist() == [[False, True, True, True]]
    assert not torch.isinf(filter_logits(logits, top_k=4, top_p=1.0)).any()


def _prefers_pad_and_sos(norm_first: bool) -> Transformer:
    model = _model(norm_first)
    with torch.no_grad():  # <pad> the most likely token everywhere, <sos> the runner-up
        model.generator.bias[PAD] = 50.0
        model.generator.bias[SOS] = 40.0
    return model


@pytest.mark.parametrize("norm_first", [False, True])
def test_beam_and_sample_never_generate_pad_or_start(norm_first):
    model = _prefers_pad_and_sos(norm_first)
    src = _padded_src()
    greedy = greedy_decode(model, src, 6, SOS, EOS)
    assert (greedy == PAD).all()  # greedy: the plain argmax, as documented
    beams, scores = beam_search(model, src, 6, SOS, EOS, beam_size=3)
    assert torch.isfinite(scores).all()
    assert not ((beams == PAD) | (beams == SOS)).any()
    gen = torch.Generator().manual_seed(0)
    for kw in (dict(), dict(temperature=5.0), dict(top_k=1), dict(top_p=0.5)):
        drawn = sample(model, src, 6, SOS, EOS, generator=gen, **kw)
        assert not ((drawn == PAD) | (drawn == SOS)).any(), kw


def test_beam_of_one_and_top_k_one_are_greedy_among_allowed_tokens():
    """With <pad> and <sos> forbidden, beam 1 and top-k 1 take the argmax of the other tokens."""
    model = _prefers_pad_and_sos(False)
    src = _padded_src()
    with torch.no_grad():
        plain = _model(False)
        plain.load_state_dict(model.state_dict())
        plain.generator.bias[PAD] = plain.generator.bias[SOS] = -1e4  # never chosen anyway
    greedy = greedy_decode(plain, src, 8, SOS, EOS)
    assert torch.equal(beam_search(model, src, 8, SOS, EOS, beam_size=1)[0], greedy)
    gen = torch.Generator().manual_seed(0)
    assert torch.equal(sample(model, src, 8, SOS, EOS, top_k=1, generator=gen), greedy)


def test_top_k_keeps_exactly_k_and_breaks_ties_toward_the_lower_id():
    tied = torch.tensor([[1.0, 3.0, 3.0, 0.0, 3.0]])
    assert torch.isfinite(filter_logits(tied, top_k=1)).tolist() == [[False, True, False, False,
                                                                      False]]
    assert torch.isfinite(filter_logits(tied, top_k=2)).tolist() == [[False, True, True, False,
                                                                      False]]
    assert torch.isfinite(filter_logits(tied, top_k=4)).tolist() == [[True, True, True, False,
                                                                      True]]
    many = torch.randint(0, 3, (200, 7)).float()  # many ties
    for k in (1, 2, 5):
        kept = torch.isfinite(filter_logits(many, top_k=k))
        assert (kept.sum(-1) == k).all()
    top1 = torch.isfinite(filter_logits(many, top_k=1)).int().argmax(-1)
    assert torch.equal(top1, many.argmax(-1))  # k = 1 is greedy, ties included


def test_top_p_threshold_is_inclusive_and_ties_go_to_the_lower_id():
    # exact in float: four tokens of probability 1/4 each; the mass above the third is 0.5 = p
    assert torch.isfinite(filter_logits(torch.zeros(1, 4), top_p=0.5)).tolist() == [
        [True, True, False, False]
    ]
    exact = torch.log(torch.tensor([[0.125, 0.5, 0.125, 0.25]], dtype=torch.float64))
    assert torch.isfinite(filter_logits(exact, top_p=0.75)).tolist() == [
        [False, True, False, True]  # 0.5 + 0.25 reaches 0.75: the nucleus is complete
    ]
    assert filter_logits(exact, top_p=0.75).dtype == torch.float64


@pytest.mark.parametrize(
    "kwargs, word",
    [(dict(top_k=0), "top_k"), (dict(top_k=1.5), "top_k"), (dict(top_p=0.0), "top_p"),
     (dict(top_p=1.2), "top_p")],
)
def test_filter_logits_bad_arguments(kwargs, word):
    with pytest.raises(ValueError, match=word):
        filter_logits(torch.zeros(2, 5), **kwargs)


BAD = [
    (beam_search, dict(beam_size=0), "beam_size"),
    (beam_search, dict(beam_size=2.5), "beam_size"),
    (beam_search, dict(length_penalty=-1.0), "length_penalty"),
    (sample, dict(temperature=0.0), "temperature"),
    (sample, dict(temperature=-1.0), "temperature"),
    (sample, dict(top_p=0.0), "top_p"),
    (sample, dict(top_p=1.5), "top_p"),
    (sample, dict(top_k=0), "top_k"),
    (greedy_decode, dict(max_len=0), "max_len"),
    (beam_search, dict(max_len=0), "max_len"),
    (sample, dict(max_len=-1), "max_len"),
    (greedy_decode, dict(start_id=99), "start_id"),
    (beam_search, dict(end_id=-1), "end_id"),
    (beam_search, dict(end_id=None), "end_id"),
    (greedy_decode, dict(src=torch.zeros(5, dtype=torch.long)), "src"),
    (greedy_decode, dict(src_mask=torch.ones(4, 7)), "src_mask"),
]


@pytest.mark.parametrize(
    "fn, kwargs, word", BAD, ids=[f"{f.__name__}-{w}-{i}" for i, (f, _, w) in enumerate(BAD)]
)
def test_bad_arguments(fn, kwargs, word):
    model = _model(False)
    args = dict(model=model, src=_padded_src(), max_len=5, start_id=SOS, end_id=EOS)
    args.update(kwargs)
    with pytest.raises(ValueError, match=word):
        fn(**args)


def test_bad_generator_type():
    with pytest.raises(TypeError, match="generator"):
        sample(_model(False), _padded_src(), 5, SOS, EOS, generator=0)
