"""course_lib.chat (lesson 16): the chat template round-trips, the grown embeddings are the mean rows
(as Hugging Face's ``resize_token_embeddings`` makes them), and generation stops at the end token.

References: the template against Hugging Face's ``apply_chat_template`` with ``template.jinja()``
(``hf_chat_tokenizer``: built locally, nothing downloaded); the grown rows against
``GPT2LMHeadModel.resize_token_embeddings(mean_resizing=True)`` on the same weights
(``load_into_hf_gpt2``); generation against ``GPT.generate`` with the same generator.
"""

from __future__ import annotations

import math

import pytest
import torch
from transformers import GPT2LMHeadModel

from course_lib.chat import (ASSISTANT, END, USER, ChatTemplate, Reply, generate_replies, generate_until,
                             grow_embeddings, hf_chat_tokenizer)
from course_lib.data.translation import CharVocab
from course_lib.gpt import GPT, GPTConfig, hf_gpt2_config, load_into_hf_gpt2

VOCAB = CharVocab.build(["abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ.,'?!:0123456789"], specials=False)
CONVERSATIONS = [
    [{"role": "user", "content": "A line with the word 'crown'."},
     {"role": "assistant", "content": "Uneasy lies the head that wears a crown."}],
    [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": ""},
     {"role": "user", "content": "A line of 5 words?"}, {"role": "assistant", "content": "Now is the winter, lords."}],
    [{"role": "assistant", "content": "  spaces  kept  "}],
]


@pytest.fixture(scope="module")
def template() -> ChatTemplate:
    return ChatTemplate(VOCAB)


def _model(seed: int = 0, tie: bool = True, vocab_size: int = len(VOCAB), max_len: int = 96) -> GPT:
    torch.manual_seed(seed)
    model = GPT(GPTConfig(vocab_size=vocab_size, max_len=max_len, d_model=32, num_heads=4, num_layers=2,
                          tie_embeddings=tie)).double().eval()
    with torch.no_grad():  # rows far from each other, biases and norms away from 0 and 1
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


def test_the_special_tokens_are_new_ids_after_the_tokenizer(template):
    V = len(VOCAB)
    assert (template.user_id, template.assistant_id, template.end_id) == (V, V + 1, V + 2)
    assert template.vocab_size == V + 3 and template.special_ids == {USER: V, ASSISTANT: V + 1, END: V + 2}


@pytest.mark.parametrize("conversation", CONVERSATIONS)
def test_render_round_trips(template, conversation):
    ids = template.render(conversation)
    assert template.parse(ids) == conversation
    assert template.render(template.parse(ids)) == ids
    text = "".join(f"<|{m['role']}|>{m['content']}<|end|>" for m in conversation)
    assert template.to_text(ids) == text
    with_prompt = template.render(conversation, add_generation_prompt=True)
    assert with_prompt == ids + [template.assistant_id]
    assert template.to_text(with_prompt) == text + ASSISTANT


@pytest.mark.parametrize("conversation", CONVERSATIONS)
def test_render_equals_hugging_faces_apply_chat_template(template, conversation):
    hf = hf_chat_tokenizer(template)
    for prompt in (False, True):
        theirs = hf.apply_chat_template(conversation, tokenize=True, return_dict=True,
                                        add_generation_prompt=prompt)["input_ids"]
        assert template.render(conversation, add_generation_prompt=prompt) == theirs
    ids = template.render(conversation)
    assert hf.decode(ids) == template.to_text(ids)
    assert (hf.eos_token_id, hf.pad_token_id) == (template.end_id, template.end_id)


def test_the_prompt_and_the_example_are_the_conversation_cut_at_the_answer(template):
    prompt, answer = template.example("Who?", "Me.")
    assert prompt == template.prompt("Who?") == template.render([{"role": "user", "content": "Who?"}], True)
    assert prompt + answer == template.render([{"role": "user", "content": "Who?"},
                                               {"role": "assistant", "content": "Me."}])
    assert answer[-1] == template.end_id and template.end_id not in answer[:-1]


@pytest.mark.parametrize("bad, message", [
    ([{"role": "user", "content": "say <|end|> now"}], "the template's own tokens"),
    ([{"role": "system", "content": "x"}], "roles are"),
    ([{"role": "user"}], "exactly the keys"),
    ([{"role": "user", "content": 3}], "must be a str"),
    ("<|user|>hi", "list of"),
    ([{"role": "user", "content": "a \u00e9 b"}], "not in the vocabulary"),
])
def test_render_refuses_bad_conversations(template, bad, message):
    with pytest.raises((ValueError, TypeError), match=message):
        template.render(bad)


@pytest.mark.parametrize("cut, message", [(-1, "never ends"), (1, "should open a turn")])
def test_parse_says_where_ids_are_not_a_conversation(template, cut, message):
    ids = template.render(CONVERSATIONS[0])
    with pytest.raises(ValueError, match=message):
        template.parse(ids[:cut] if cut < 0 else ids[cut:])


def test_grown_rows_are_the_mean_and_the_old_logits_do_not_move():
    model = _model()
    ids = torch.randint(len(VOCAB), (3, 20))
    before = model(ids)
    old_table = model.embed.token.embedding.weight.detach().clone()
    assert grow_embeddings(model, 3) is model
    table = model.embed.token.embedding.weight
    assert model.config.vocab_size == len(VOCAB) + 3 and table.shape == (len(VOCAB) + 3, 32)
    assert model.lm_head.weight is table  # still tied
    assert torch.equal(table[: len(VOCAB)], old_table)
    assert torch.allclose(table[len(VOCAB):], old_table.mean(0).expand(3, -1), atol=0, rtol=1e-15)
    after = model(ids)  # the old tokens' logits are unchanged; each new one is their mean
    assert torch.equal(after[..., : len(VOCAB)], before)
    assert torch.allclose(after[..., len(VOCAB):], before.mean(-1, keepdim=True).expand(-1, -1, 3), atol=1e-12)
    model(torch.tensor([[len(VOCAB) + 2]])).sum().backward()  # the new rows are trained like the others
    assert model.embed.token.embedding.weight.grad[len(VOCAB) + 2].abs().sum() > 0


def test_an_untied_output_layer_grows_its_own_mean_rows():
    model = _model(tie=False)
    head, table = model.lm_head.weight.detach().clone(), model.embed.token.embedding.weight.detach().clone()
    grow_embeddings(model, 2)
    assert model.lm_head.weight is not model.embed.token.embedding.weight
    assert torch.allclose(model.lm_head.weight[-2:], head.mean(0).expand(2, -1), atol=1e-15)
    assert torch.allclose(model.embed.token.embedding.weight[-2:], table.mean(0).expand(2, -1), atol=1e-15)


def test_the_mean_rows_move_the_old_distribution_by_at_most_log_1_plus_k_over_v():
    """Jensen: exp(mean logit) <= mean exp(logit), so the k new tokens take at most k/(V+k) of the
    probability and KL(p_old || p_new on the old tokens) = log(Z_new / Z_old) <= log(1 + k/V)."""
    for seed in range(3):
        model = _model(seed)
        ids = torch.randint(len(VOCAB), (4, 30))
        p_old = model(ids).log_softmax(-1)
        k = 3
        grow_embeddings(model, k)
        p_new = model(ids).log_softmax(-1)[..., : len(VOCAB)]
        kl = (p_old.exp() * (p_old - p_new)).sum(-1)  # (B, T)
        assert kl.max() <= math.log(1 + k / len(VOCAB)) + 1e-12
        assert kl.min() >= 0


def test_grow_embeddings_equals_hugging_faces_mean_resizing():
    """transformers' resize_token_embeddings(mean_resizing=True) draws the new rows from a normal
    around the old rows' mean with 1e-9 times their covariance (in float32): the mean within 1e-5
    (measured 6.7e-6, rows of spread 0.1)."""
    model = _model()
    hf = GPT2LMHeadModel(hf_gpt2_config(model.config)).double()
    load_into_hf_gpt2(model, hf)
    torch.manual_seed(0)
    hf.resize_token_embeddings(len(VOCAB) + 3, mean_resizing=True)
    grow_embeddings(model, 3)
    theirs = hf.transformer.wte.weight.detach()
    ours = model.embed.token.embedding.weight.detach()
    assert theirs.shape == ours.shape and torch.equal(theirs[: len(VOCAB)], ours[: len(VOCAB)])
    assert (theirs[len(VOCAB):] - ours[len(VOCAB):]).abs().max() < 1e-5
    assert hf.lm_head.weight is hf.transformer.wte.weight  # tied there too


@pytest.mark.parametrize("bad, message", [(0, "num_new_tokens"), (2.0, "num_new_tokens")])
def test_grow_embeddings_refuses_bad_counts(bad, message):
    with pytest.raises(ValueError, match=message):
        grow_embeddings(_model(), bad)
    with pytest.raises(TypeError, match="course_lib's GPT"):
        grow_embeddings(torch.nn.Linear(2, 2), 1)


@pytest.fixture(scope="module")
def chat_model(template) -> GPT:
    return grow_embeddings(_model(vocab_size=len(VOCAB)), 3)


@pytest.mark.parametrize("seed", [0, 1])
def test_one_prompt_gives_the_tokens_of_generate_cut_after_the_stop_token(template, chat_model, seed):
    prompt = template.prompt("A line of 5 words.")
    ours = generate_until(chat_model, [prompt], template.end_id, 16, generator=torch.Generator().manual_seed(seed))[0]
    theirs = chat_model.generate(torch.tensor([prompt]), 16, generator=torch.Generator().manual_seed(seed))
    theirs = theirs[0, len(prompt):].tolist()
    cut = theirs.index(template.end_id) + 1 if template.end_id in theirs else len(theirs)
    assert ours == theirs[:cut]


def test_a_batch_of_prompts_of_different_lengths_gives_each_prompts_own_answer(template, chat_model):
    prompts = [template.prompt(x) for x in ("Hi", "The word 'crown'.", "Why not?")]
    together = generate_until(chat_model, prompts, template.end_id, 10, greedy=True)
    alone = [generate_until(chat_model, [p], template.end_id, 10, greedy=True)[0] for p in prompts]
    assert together == alone
    whole = chat_model.generate(torch.tensor([prompts[1]]), 10, greedy=True)[0, len(prompts[1]):].tolist()
    cut = whole.index(template.end_id) + 1 if template.end_id in whole else len(whole)
    assert together[1] == whole[:cut]


def test_generation_stops_at_the_end_token(template):
    """A model whose every prediction is <|end|> answers with nothing; one that draws <|end|> as often
    as its likeliest character stops in some rows, and never writes past the end token."""
    model = grow_embeddings(_model(), 3)
    with torch.no_grad():  # final LayerNorm outputs its bias u; the end row is 10 u: always the argmax
        u = torch.randn(32, dtype=torch.float64)
        model.blocks.norm.weight.zero_()
        model.blocks.norm.bias.copy_(u)
        model.embed.token.embedding.weight[template.end_id] = 10 * u
    replies = generate_replies(model, template, ["Hi", "A line."], max_new_tokens=30, greedy=True)
    assert replies == [Reply("", [template.end_id], True)] * 2
    model = grow_embeddings(_model(seed=1), 3)
    with torch.no_grad():  # the end token's row = the likeliest first character's: equally likely everywhere
        first = int(model(torch.tensor([template.prompt("Hi")]))[0, -1].argmax())
        model.embed.token.embedding.weight[template.end_id] = model.embed.token.embedding.weight[first]
    replies = generate_replies(model, template, ["Hi"] * 12, max_new_tokens=12,
                               generator=torch.Generator().manual_seed(0))
    stopped = [r for r in replies if r.stopped]
    assert 0 < len(stopped) < 12  # measured: 5 of 12
    for r in replies:
        assert template.end_id not in r.ids[:-1] and len(r.ids) <= 12
        assert r.stopped == (r.ids[-1] == template.end_id)
        assert r.text == template.to_text(r.ids[:-1] if r.stopped else r.ids)
    assert all(len(r.ids) == 12 for r in replies if not r.stopped)


def test_generation_ends_at_the_models_last_position(template):
    model = grow_embeddings(_model(max_len=24), 3)
    prompt = template.prompt("Hello there")  # 14 ids: 10 positions left, the 11th token is drawn last
    out = generate_until(model, [prompt], template.end_id, 100, greedy=True)[0]
    if template.end_id not in out:
        assert len(out) == 24 - len(prompt) + 1


@pytest.mark.parametrize("call, message", [
    (lambda m, t: generate_until(m, [list(range(200))], t.end_id, 5), "more than the model's max_len"),
    (lambda m, t: generate_until(m, [], t.end_id, 5), "non-empty list"),
    (lambda m, t: generate_until(m, [[1, 2]], 999, 5), "stop_id"),
    (lambda m, t: generate_until(m, [[1, 2]], t.end_id, 0), "max_new_tokens"),
    (lambda m, t: generate_until(m, [[1, 999]], t.end_id, 3), "prompt ids"),
    (lambda m, t: generate_replies(m, t, "one string"), "list of str"),
    (lambda m, t: generate_replies(m, t, ["Hi"], temperature=0), "temperature"),
    (lambda m, t: generate_replies(m, t, ["Hi"], top_k=0), "top_k"),
    (lambda m, t: generate_replies(m, t, ["Hi"], generator=3), "torch.Generator"),
])
def test_generation_refuses_bad_input(template, chat_model, call, message):
    with pytest.raises((ValueError, TypeError), match=message):
        call(chat_model, template)


def test_generate_replies_needs_the_grown_model(template):
    with pytest.raises(ValueError, match="grow_embeddings"):
        generate_replies(_model(), template, ["Hi"])


def test_hf_chat_tokenizer_needs_one_character_per_id():
    with pytest.raises(ValueError, match="one distinct character per id"):
        hf_chat_tokenizer(ChatTemplate(CharVocab.build(["abc"])))  # with <pad>, <sos>, <eos>
