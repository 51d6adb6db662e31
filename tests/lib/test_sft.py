"""course_lib.sft (lesson 16) against TRL 1.16.0's completion-only loss.

The reference is ``trl.SFTTrainer`` itself, with ``completion_only_loss=True`` on a conversational
prompt-completion data set, the tokenizer ``hf_chat_tokenizer(template)`` (built locally) and a
``GPT2LMHeadModel`` holding the course GPT's weights (``load_into_hf_gpt2``; a small config, nothing
downloaded), in float64 (``bf16=False``: TRL's configs default to bf16 autocast):

- the labels TRL's ``_prepare_dataset`` builds (``completion_mask`` -> -100) and the batch its
  ``DataCollatorForLanguageModeling`` pads equal ``sft_example`` / ``sft_batch``, id for id;
- ``SFTTrainer.compute_loss`` equals ``sft_loss`` to float32 precision (within 2e-6; measured 8e-9 to
  3.1e-7 over three seeds): TRL's fused LM head (``trl.kernels.chunked_logprob``) computes the
  log-softmax in float32 whatever the model's dtype; its gradients equal ours within 1e-5 of their
  largest entry (measured <= 2.8e-7);
- in float64, TRL's reduction (the summed ``-log p`` of the labelled tokens divided by their number)
  on the Hugging Face model's logits and TRL's labels equals ``sft_loss`` within 1e-12. (The model's
  own ``labels=`` loss is no float64 reference: transformers' ``ForCausalLMLoss`` casts the logits
  to float32.)
"""

from __future__ import annotations

import copy

import pytest
import torch

from course_lib.chat import ChatTemplate, grow_embeddings, hf_chat_tokenizer
from course_lib.data.translation import CharVocab
from course_lib.gpt import GPT, GPTConfig, hf_gpt2_config, load_into_hf_gpt2
from course_lib.sft import IGNORE_INDEX, sft_batch, sft_example, sft_loss

trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")
from transformers import GPT2LMHeadModel  # noqa: E402

# TRL 1.16.0 reads transformers' old name for activation checkpointing (a deprecation of theirs, not ours)
pytestmark = pytest.mark.filterwarnings("ignore:.*gradient_checkpointing.*:FutureWarning")

PAIRS = [("A line with the word 'crown'.", "Uneasy lies the head that wears a crown."),
         ("A line of exactly 5 words.", "Now is the winter here."),
         ("A line of about 10 syllables.", "But soft, what light through yonder window breaks?"),
         ("Who?", "Me.")]
VOCAB = CharVocab.build([text for pair in PAIRS for text in pair], specials=False)


def _model(seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    model = GPT(GPTConfig(vocab_size=len(VOCAB), max_len=96, d_model=32, num_heads=4, num_layers=2)).double()
    with torch.no_grad():  # biases and norms away from 0 and 1, so a port that drops one fails
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return grow_embeddings(model, 3).eval()


def _hf(model: GPT) -> GPT2LMHeadModel:
    hf = GPT2LMHeadModel(hf_gpt2_config(model.config)).double().eval()
    load_into_hf_gpt2(model, hf)
    return hf


@pytest.fixture(scope="module")
def template() -> ChatTemplate:
    return ChatTemplate(VOCAB)


def _trainer(template, hf, tmp_path, completion_only_loss=True):
    rows = [{"prompt": [{"role": "user", "content": x}], "completion": [{"role": "assistant", "content": y}]}
            for x, y in PAIRS]
    args = trl.SFTConfig(output_dir=str(tmp_path), report_to="none", completion_only_loss=completion_only_loss,
                         max_length=None, use_cpu=True, bf16=False, disable_tqdm=True)
    return trl.SFTTrainer(model=hf, args=args, train_dataset=datasets.Dataset.from_list(rows),
                          processing_class=hf_chat_tokenizer(template))


@pytest.fixture(scope="module")
def trained(template, tmp_path_factory):
    """(our model, the HF model with its weights, TRL's trainer) once for the module."""
    datasets.disable_progress_bars()
    model = _model()
    hf = _hf(model)
    return model, hf, _trainer(template, hf, tmp_path_factory.mktemp("sft"))


def test_labels_mask_the_prompt_and_keep_the_answer_and_its_end(template):
    ids, labels = sft_example(template, "Who?", "Me.")
    prompt, answer = template.example("Who?", "Me.")
    assert ids == prompt + answer
    assert labels == [IGNORE_INDEX] * len(prompt) + answer
    assert labels[-1] == template.end_id
    assert sft_example(template, "Who?", "Me.", mask_prompt=False) == (ids, ids)


def test_labels_equal_trls_completion_only_labels(template, trained):
    _, _, trainer = trained
    rows = list(trainer.train_dataset)
    assert len(rows) == len(PAIRS)
    for row, (x, y) in zip(rows, PAIRS):
        ids, labels = sft_example(template, x, y)
        assert row["input_ids"] == ids
        assert row["labels"] == labels


def test_the_padded_batch_equals_trls_collator(template, trained):
    _, _, trainer = trained
    theirs = trainer.data_collator([{"input_ids": r["input_ids"], "labels": r["labels"]}
                                    for r in trainer.train_dataset])
    ids, labels = sft_batch([sft_example(template, x, y) for x, y in PAIRS], template.end_id)
    assert torch.equal(theirs["input_ids"], ids) and torch.equal(theirs["labels"], labels)
    assert torch.equal(theirs["attention_mask"].bool(), labels.ne(IGNORE_INDEX) | (torch.arange(ids.size(1))
                       < torch.tensor([len(sft_example(template, x, y)[0]) for x, y in PAIRS])[:, None]))


def _hf_grads(model: GPT) -> dict[str, torch.Tensor]:
    """Our gradients in Hugging Face's layout: a GPT whose weights are our gradients, ported."""
    grads = copy.deepcopy(model)
    with torch.no_grad():
        for p, g in zip(grads.parameters(), model.parameters()):
            p.copy_(g.grad)
    hf = GPT2LMHeadModel(hf_gpt2_config(model.config)).double()
    load_into_hf_gpt2(grads, hf)
    return dict(hf.named_parameters())


def test_the_loss_and_its_gradients_equal_trls(template, trained):
    model, hf, trainer = trained
    batch = trainer.data_collator([{"input_ids": r["input_ids"], "labels": r["labels"]}
                                   for r in trainer.train_dataset])
    ids, labels = sft_batch([sft_example(template, x, y) for x, y in PAIRS], template.end_id)
    model.zero_grad(), hf.zero_grad()
    theirs = trainer.compute_loss(hf, batch)
    ours = sft_loss(model(ids), labels)
    assert ours.dtype == torch.float64
    assert abs(theirs.item() - ours.item()) < 2e-6  # TRL's fused head: float32 inside (measured <= 3.1e-7)
    theirs.backward(), ours.backward()
    mine = _hf_grads(model)
    for name, p in hf.named_parameters():
        scale = p.grad.abs().max().item() + 1e-12
        assert (p.grad - mine[name]).abs().max().item() <= 1e-5 * scale, name
    with torch.no_grad():  # float64: TRL's reduction (summed -log p of the labelled tokens / their
        # number) on the Hugging Face model's logits and TRL's labels
        logits = hf(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits  # (B, T, V)
        log_p = logits[:, :-1].log_softmax(-1)
        target = batch["labels"][:, 1:]
        counted = target != IGNORE_INDEX
        picked = log_p.gather(-1, target.clamp(min=0).unsqueeze(-1)).squeeze(-1)[counted]
        exact = -picked.sum() / counted.sum()
    assert logits.dtype == torch.float64 and abs(exact.item() - ours.item()) < 1e-12


def test_without_masking_the_labels_equal_trls_full_sequence_loss(template, tmp_path):
    model = _model(seed=1)
    hf = _hf(model)
    trainer = _trainer(template, hf, tmp_path, completion_only_loss=False)
    for row, (x, y) in zip(trainer.train_dataset, PAIRS):
        assert row["labels"] == sft_example(template, x, y, mask_prompt=False)[1]
    batch = trainer.data_collator([{"input_ids": r["input_ids"], "labels": r["labels"]}
                                   for r in trainer.train_dataset])
    ids, labels = sft_batch([sft_example(template, x, y, mask_prompt=False) for x, y in PAIRS], template.end_id)
    assert torch.equal(batch["labels"], labels)
    with torch.no_grad():
        assert abs(trainer.compute_loss(hf, batch).item() - sft_loss(model(ids), labels).item()) < 2e-6


def test_masking_changes_the_loss_to_the_answers_tokens_only(template):
    model = _model(seed=2)
    masked = sft_batch([sft_example(template, x, y) for x, y in PAIRS], template.end_id)
    full = sft_batch([sft_example(template, x, y, mask_prompt=False) for x, y in PAIRS], template.end_id)
    with torch.no_grad():
        log_p = model(masked[0]).log_softmax(-1)[:, :-1]  # (B, T-1, V)
        nll = -log_p.gather(-1, full[1][:, 1:].clamp(min=0).unsqueeze(-1)).squeeze(-1)  # (B, T-1)
        answer = masked[1][:, 1:] != IGNORE_INDEX
        assert torch.allclose(sft_loss(model(masked[0]), masked[1]), nll[answer].mean(), atol=1e-12)
        assert torch.allclose(sft_loss(model(full[0]), full[1]), nll[full[1][:, 1:] != IGNORE_INDEX].mean(),
                              atol=1e-12)


@pytest.mark.parametrize("call, message", [
    (lambda t: sft_example("not a template", "a", "b"), "ChatTemplate"),
    (lambda t: sft_batch([], t.end_id), "no examples"),
    (lambda t: sft_batch([([1, 2], [1])], t.end_id), "pair"),
    (lambda t: sft_batch([sft_example(t, "a", "b")], -1), "pad_id"),
    (lambda t: sft_loss(torch.zeros(2, 5, 3), torch.zeros(2, 4, dtype=torch.long)), r"\(B, T, V\)"),
    (lambda t: sft_loss(torch.zeros(2, 5, 3), torch.full((2, 5), -100)), "every target is -100"),
])
def test_bad_input_gets_a_clear_message(template, call, message):
    with pytest.raises((ValueError, TypeError), match=message):
        call(template)
