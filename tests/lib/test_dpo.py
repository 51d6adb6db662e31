"""course_lib.dpo (lesson 16) against TRL 1.16.0's DPO loss (``DPOTrainer``, ``loss_type="sigmoid"``).

TRL 1.16.0 has no separate loss function: ``DPOTrainer._compute_loss`` sums each row's per-token
log-probabilities, takes the log-ratios to the reference and applies ``-logsigmoid(beta * delta)``.
Both tests call ``DPOTrainer.compute_loss`` itself (``bf16=False``: TRL's configs default to bf16
autocast, which would round the reference model's forward):

- **on the same log-probabilities**, float64: a stand-in model returns given per-token
  log-probabilities (what TRL's fused LM head returns) and the reference's sums come in the batch
  (``precompute_ref_log_probs=True``); TRL's loss, its gradient with respect to every per-token
  log-probability, and its logged rewards, margins and accuracy equal ``dpo_loss`` and
  ``reward_metrics`` within 1e-12 (measured: 0, bitwise), at three values of beta;
- **on the same model and batch**: ``GPT2LMHeadModel``s holding the course GPT's policy and reference
  weights (``load_into_hf_gpt2``), the tokenizer ``hf_chat_tokenizer(template)`` and a conversational
  preference data set, all built locally. TRL's tokenized rows and its collated batch
  (``DataCollatorForPreference``: chosen rows, then rejected rows) equal ``preference_batch``; TRL's
  sequence log-probabilities (its fused LM head computes the log-softmax in float32, whatever the
  model's dtype) equal ``sequence_log_probs`` within 1e-4 (sums of up to 51 tokens; measured <= 1.3e-5
  over three seeds); the loss within 2e-5 (measured <= 1.8e-6), the logged rewards within 2e-5
  (measured <= 3.2e-6) and the gradients within 1e-4 of their largest entry (measured <= 2.8e-6).
"""

from __future__ import annotations

import copy
import math
from types import SimpleNamespace

import pytest
import torch

from course_lib.chat import ChatTemplate, grow_embeddings, hf_chat_tokenizer
from course_lib.data.translation import CharVocab
from course_lib.dpo import (chosen_rejected_log_probs, dpo_loss, preference_batch, reward_metrics,
                            sequence_log_probs)
from course_lib.gpt import GPT, GPTConfig, hf_gpt2_config, load_into_hf_gpt2
from course_lib.sft import IGNORE_INDEX

trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")
from transformers import GPT2LMHeadModel  # noqa: E402

# TRL 1.16.0 reads transformers' old name for activation checkpointing (a deprecation of theirs, not ours)
pytestmark = pytest.mark.filterwarnings("ignore:.*gradient_checkpointing.*:FutureWarning")

TRIPLES = [("A line with the word 'crown'.", "Uneasy lies the head that wears a crown.", "The crown."),
           ("A line of exactly 5 words.", "Now is the winter here.", "No"),
           ("A line of about 10 syllables.", "But soft, what light through yonder window breaks?", "Soft?"),
           ("Who?", "Me.", "Nobody at all, my lord.")]
VOCAB = CharVocab.build([text for triple in TRIPLES for text in triple], specials=False)
PROMPTS, CHOSEN, REJECTED = (list(x) for x in zip(*TRIPLES))


@pytest.fixture(scope="module")
def template() -> ChatTemplate:
    return ChatTemplate(VOCAB)


def _model(seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    model = GPT(GPTConfig(vocab_size=len(VOCAB), max_len=96, d_model=32, num_heads=4, num_layers=2)).double()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return grow_embeddings(model, 3)


def _hf(model: GPT) -> GPT2LMHeadModel:
    hf = GPT2LMHeadModel(hf_gpt2_config(model.config)).double()
    load_into_hf_gpt2(model, hf)
    return hf


def _rows() -> list[dict]:
    return [{"prompt": [{"role": "user", "content": x}], "chosen": [{"role": "assistant", "content": c}],
             "rejected": [{"role": "assistant", "content": r}]} for x, c, r in TRIPLES]


def _trainer(template, policy, ref, folder, beta: float, precompute: bool = False):
    datasets.disable_progress_bars()
    args = trl.DPOConfig(output_dir=str(folder), report_to="none", beta=beta, loss_type=["sigmoid"],
                         max_length=None, use_cpu=True, bf16=False, disable_tqdm=True,
                         precompute_ref_log_probs=precompute)
    return trl.DPOTrainer(model=policy, ref_model=ref, args=args, train_dataset=datasets.Dataset.from_list(_rows()),
                          processing_class=hf_chat_tokenizer(template))


def test_the_batch_holds_chosen_rows_then_rejected_rows_labelled_on_the_answers(template):
    ids, labels = preference_batch(template, PROMPTS, CHOSEN, REJECTED)
    B = len(PROMPTS)
    assert ids.shape[0] == labels.shape[0] == 2 * B
    for i, (x, c, r) in enumerate(TRIPLES):
        for row, answer in ((i, c), (B + i, r)):
            prompt, reply = template.example(x, answer)
            n = len(prompt) + len(reply)
            assert ids[row, :n].tolist() == prompt + reply
            assert labels[row, :n].tolist() == [IGNORE_INDEX] * len(prompt) + reply
            assert (labels[row, n:] == IGNORE_INDEX).all() and (ids[row, n:] == template.end_id).all()


def test_sequence_log_probs_sum_the_answer_tokens_and_skip_prompt_and_padding(template):
    model = _model()
    ids, labels = preference_batch(template, PROMPTS, CHOSEN, REJECTED)
    with torch.no_grad():
        got = sequence_log_probs(model(ids), labels)
        for row in range(ids.size(0)):  # each row alone, unpadded, token by token
            seq = ids[row : row + 1, : int(labels[row].ne(IGNORE_INDEX).nonzero().max()) + 1]
            log_p = model(seq).log_softmax(-1)[0]
            total = sum(log_p[t - 1, seq[0, t]].item() for t in range(seq.size(1)) if labels[row, t] != IGNORE_INDEX)
            assert abs(got[row].item() - total) < 1e-10, row


@pytest.mark.parametrize("beta", [0.05, 0.1, 0.5])
def test_the_loss_and_its_gradients_equal_trls_on_the_same_log_probabilities(template, tmp_path, beta):
    model = _model()
    trainer = _trainer(template, _hf(model), None, tmp_path, beta, precompute=True)
    batch = trainer.data_collator([{k: r[k] for k in ("prompt_ids", "chosen_ids", "rejected_ids")}
                                   for r in trainer.train_dataset])
    N, T = batch["input_ids"].shape
    B = N // 2
    gen = torch.Generator().manual_seed(int(beta * 100))
    per_token = (-3 * torch.rand(N, T - 1, generator=gen, dtype=torch.float64)).requires_grad_()  # (2B, T-1)
    ref = -40 * torch.rand(N, generator=gen, dtype=torch.float64)  # (2B,) the reference's sums
    counted = batch["completion_mask"][:, 1:].bool()  # (2B, T-1): the answer's tokens

    class GivenLogProbs(torch.nn.Module):
        """Stands in for the policy: returns what TRL's fused LM head returns, given log-probabilities."""

        def forward(self, input_ids, attention_mask=None, labels=None, fused_lm_head=False, use_cache=None):
            assert fused_lm_head and torch.equal(labels[:, 1:] != IGNORE_INDEX, counted)
            zeros = torch.zeros_like(per_token)
            return SimpleNamespace(log_probs=per_token * counted, entropy=zeros, mean_logits=zeros,
                                   is_top1=torch.zeros_like(counted), log_sum_sq_probs=zeros)

    inputs = dict(batch, ref_chosen_logps=ref[:B], ref_rejected_logps=ref[B:])
    theirs = trainer.compute_loss(GivenLogProbs(), inputs)
    (grad_theirs,) = torch.autograd.grad(theirs, per_token)
    logps = (per_token * counted).sum(1)  # (2B,)
    out = dpo_loss(logps[:B], logps[B:], ref[:B], ref[B:], beta=beta)
    ours = out.losses.mean()
    (grad_ours,) = torch.autograd.grad(ours, per_token)
    assert theirs.dtype == torch.float64 and abs(theirs.item() - ours.item()) < 1e-12
    assert (grad_theirs - grad_ours).abs().max() < 1e-12
    logged = {k: v[-1] for k, v in trainer._metrics["train"].items() if k.startswith("rewards/")}
    mine = reward_metrics(out.chosen_rewards, out.rejected_rewards)
    assert set(logged) == set(mine)
    for key in mine:
        assert abs(logged[key] - mine[key]) < 1e-12, key


def test_the_loss_is_log_2_when_the_policy_is_the_reference():
    logps = -10 * torch.rand(4, dtype=torch.float64) - 1
    other = -10 * torch.rand(4, dtype=torch.float64) - 1
    out = dpo_loss(logps, other, logps, other, beta=0.1)
    assert torch.allclose(out.losses, torch.full((4,), math.log(2), dtype=torch.float64), atol=1e-15)
    assert torch.equal(out.chosen_rewards, torch.zeros(4, dtype=torch.float64))
    assert reward_metrics(out.chosen_rewards, out.rejected_rewards)["rewards/accuracies"] == 0.0


def test_the_loss_and_rewards_equal_trls_through_its_trainer_on_the_same_model(template, tmp_path):
    policy, reference = _model(seed=0), _model(seed=0)
    with torch.no_grad():  # the policy a little away from the reference
        for p in policy.parameters():
            p.add_(0.02 * torch.randn_like(p))
    hf_policy, hf_ref = _hf(policy), _hf(reference)
    beta = 0.3
    trainer = _trainer(template, hf_policy, hf_ref, tmp_path, beta)
    ids, labels = preference_batch(template, PROMPTS, CHOSEN, REJECTED)
    for row, (x, c, r) in zip(trainer.train_dataset, TRIPLES):  # TRL's tokenization of each triple
        assert row["prompt_ids"] == template.prompt(x)
        assert row["chosen_ids"] == template.example(x, c)[1] and row["rejected_ids"] == template.example(x, r)[1]
    batch = trainer.data_collator([{k: r[k] for k in ("prompt_ids", "chosen_ids", "rejected_ids")}
                                   for r in trainer.train_dataset])
    assert torch.equal(batch["input_ids"], ids)
    assert torch.equal(batch["input_ids"].masked_fill(batch["completion_mask"] == 0, IGNORE_INDEX), labels)

    theirs = trainer.compute_loss(trainer.model, batch)
    theirs.backward()
    logged = {k: v[-1] for k, v in trainer._metrics["train"].items()}
    pc, pr = chosen_rejected_log_probs(policy, ids, labels)
    with torch.no_grad():
        rc, rr = chosen_rejected_log_probs(reference, ids, labels)
    out = dpo_loss(pc, pr, rc, rr, beta=beta)
    ours = out.losses.mean()
    ours.backward()
    assert abs(theirs.item() - ours.item()) < 2e-5  # TRL's fused head: float32 inside (measured <= 1.8e-6)
    assert abs(logged["logps/chosen"] - pc.mean().item()) < 1e-4
    assert abs(logged["logps/rejected"] - pr.mean().item()) < 1e-4
    for key, value in reward_metrics(out.chosen_rewards, out.rejected_rewards).items():
        assert abs(logged[key] - value) < 2e-5, key
    labels_trl = batch["input_ids"].masked_fill(batch["completion_mask"] == 0, IGNORE_INDEX)
    with torch.no_grad():  # TRL's per-row sums from its own forward of each model
        kw = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=labels_trl,
                  fused_lm_head=True)
        trl_policy = trainer.model(**kw).log_probs.sum(1)
        trl_ref = trainer.ref_model(**kw).log_probs.sum(1)
    assert (trl_policy - torch.cat([pc, pr])).abs().max() < 1e-4
    assert (trl_ref - torch.cat([rc, rr])).abs().max() < 1e-4
    grads = copy.deepcopy(policy)  # our gradients in Hugging Face's layout
    with torch.no_grad():
        for p, q in zip(grads.parameters(), policy.parameters()):
            p.copy_(q.grad)
    hf_grads = _hf(grads)
    for (name, p), (_, g) in zip(hf_policy.named_parameters(), hf_grads.named_parameters()):
        assert (p.grad - g).abs().max() <= 1e-4 * (p.grad.abs().max() + 1e-12), name


def test_the_reference_gets_no_gradient_and_rewards_are_detached(template):
    policy, reference = _model(seed=1), _model(seed=2)
    ids, labels = preference_batch(template, PROMPTS, CHOSEN, REJECTED)
    pc, pr = chosen_rejected_log_probs(policy, ids, labels)
    with torch.no_grad():
        rc, rr = chosen_rejected_log_probs(reference, ids, labels)
    out = dpo_loss(pc, pr, rc, rr)
    assert not out.chosen_rewards.requires_grad and not out.rejected_rewards.requires_grad
    out.losses.mean().backward()
    assert all(p.grad is None for p in reference.parameters())


@pytest.mark.parametrize("call, message", [
    (lambda t: dpo_loss(*[torch.zeros(3, dtype=torch.float64)] * 4, beta=0), "beta"),
    (lambda t: dpo_loss(*[torch.zeros(3)] * 3, torch.zeros(2)), r"\(B,\)"),
    (lambda t: dpo_loss(*[torch.zeros(3, dtype=torch.long)] * 4), "float"),
    (lambda t: dpo_loss(*[[0.0]] * 4), "tensors"),
    (lambda t: preference_batch(t, ["a"], ["b"], []), "as many"),
    (lambda t: preference_batch(t, "a", ["b"], ["c"]), "list of str"),
    (lambda t: sequence_log_probs(torch.zeros(2, 5, 3), torch.full((2, 5), IGNORE_INDEX)), "no labelled token"),
    (lambda t: sequence_log_probs(torch.zeros(2, 5, 3), torch.full((2, 5), 7)), "labels must be ids"),
    (lambda t: sequence_log_probs(torch.zeros(2, 5), torch.zeros(2, 5, dtype=torch.long)), r"\(N, T, V\)"),
    (lambda t: chosen_rejected_log_probs(lambda x: x, torch.zeros(3, 4, dtype=torch.long), None), r"\(2B, T\)"),
])
def test_bad_input_gets_a_clear_message(template, call, message):
    with pytest.raises((ValueError, TypeError), match=message):
        call(template)
