"""Lesson 16's study (course_lib.studies.instruct) on tiny settings: SFT puts its loss where it says
and leaves the base alone, preference pairs are an accepted answer against a refused one, DPO's
reference stays frozen and unchanged, its first loss is log 2, the KL from an equal model is 0, and
the stored runs round-trip. Tiny untrained models and a few steps: the real study is `make instruct`."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from course_lib.chat import Reply
from course_lib.data.instructions import judge, make_instruction
from course_lib.gpt import GPT, GPTConfig
from course_lib.studies import instruct
from course_lib.studies.instruct import (MAX_LEN, Pairs, chat_data, dpo, evaluate, kl_from_reference,
                                         load_instruct_results, plays_loss, preference_pairs,
                                         save_instruct_results, sft, train_chat_base)


@pytest.fixture(scope="module")
def tiny() -> GPT:
    """An untrained 1-layer GPT with the template's ids and 128 positions."""
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=chat_data().template.vocab_size, max_len=MAX_LEN, d_model=16, num_heads=2,
                       num_layers=1)
    return GPT(config).eval()


def state(model: GPT) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def first_batch_loss(model: GPT, pool, seed: int, batch_size: int, mask_prompt: bool) -> float:
    """The loss of sft's first step, recomputed: the same draw, labels by hand (written here)."""
    template = chat_data().template
    picks = torch.randint(len(pool), (batch_size,), generator=torch.Generator().manual_seed(seed)).tolist()
    rows = []
    for i in picks:
        prompt = template.prompt(pool[i].prompt)
        answer = template.encode_text(pool[i].reference) + [template.end_id]
        rows.append((prompt, answer))
    total, count = 0.0, 0
    with torch.no_grad():
        for prompt, answer in rows:
            ids = torch.tensor([prompt + answer])  # (1, T)
            log_p = model(ids)[0, :-1].log_softmax(-1)  # (T-1, V)
            targets = ids[0, 1:]
            first = len(prompt) - 1 if mask_prompt else 0  # position predicting the first labelled token
            picked = log_p[first:].gather(-1, targets[first:, None])
            total -= picked.sum().item()
            count += picked.numel()
    return total / count


@pytest.mark.parametrize("mask_prompt", [True, False])
def test_sft_puts_the_loss_on_the_answer_only_when_masked_and_leaves_the_base_alone(tiny, mask_prompt):
    pool = chat_data().sft_train[:50]
    before = state(tiny)
    run = sft(tiny, steps=2, mask_prompt=mask_prompt, seed=3, batch_size=4, instructions=pool)
    assert same(state(tiny), before)  # the base is untouched
    assert not same(state(run.model), before)  # the copy trained
    assert len(run.losses) == 2 and run.mask_prompt is mask_prompt
    assert run.losses[0] == pytest.approx(first_batch_loss(tiny, pool, 3, 4, mask_prompt), rel=1e-5)
    other = first_batch_loss(tiny, pool, 3, 4, not mask_prompt)
    assert abs(run.losses[0] - other) > 1e-3  # the two labellings give other numbers on this batch


def test_preference_pairs_keep_an_accepted_answer_against_a_refused_one(tiny, monkeypatch):
    crown, six = make_instruction("word", "crown"), make_instruction("words", 6)
    night = make_instruction("word", "night")
    samples = {  # per prompt, the 3 "sampled" answers
        crown.prompt: ["no crown here", "Uneasy lies the head that wears a crown.", "the crown is mine"],
        six.prompt: ["one two three four five six", "one two three four five six seven", "a b c d e f"],
        night.prompt: ["good night sweet prince", "the night is long", "<|user|> the end is near"],
    }

    def fake(model, template, prompts, max_new_tokens, **sampling):
        seen: dict[str, int] = {}
        out = []
        for p in prompts:
            k = seen.get(p, 0)
            seen[p] = k + 1
            text = samples[p][k]
            out.append(Reply(text, [], True))
        return out

    monkeypatch.setattr(instruct, "generate_replies", fake)
    refused_only = make_instruction("word", "sword")
    samples[refused_only.prompt] = ["no such word", "nor here", "nothing"]
    pairs = preference_pairs(tiny, [crown, six, night, refused_only], samples=3, seed=0)
    assert len(pairs) == 1 and pairs.all_pass == 2 and pairs.all_fail == 1 and pairs.total == 4
    # crown: every answer has the word; six: every answer has 6 words... except the second
    assert pairs.instructions == [six]
    assert pairs.chosen == ["one two three four five six"] and pairs.rejected == ["one two three four five six seven"]
    for x, c, r in zip(pairs.instructions, pairs.chosen, pairs.rejected):
        assert judge(x, c) and not judge(x, r)
    # night: the refused answer holds a template token, so it cannot be a rejected answer: no pair
    assert night not in pairs.instructions
    assert pairs.pass_rate == pytest.approx(7 / 12)


def test_preference_pairs_from_a_model_count_every_instruction(tiny):
    xs = chat_data().sft_train[:6]
    pairs = preference_pairs(tiny, xs, samples=2, seed=0, max_new_tokens=8)
    assert len(pairs) + pairs.all_pass + pairs.all_fail == len(xs)
    for x, c, r in zip(pairs.instructions, pairs.chosen, pairs.rejected):
        assert judge(x, c) and not judge(x, r)


def small_pairs() -> Pairs:
    a, b = make_instruction("word", "crown"), make_instruction("words", 4)
    return Pairs([a, b], ["the crown is mine", "one two three four"], ["no", "one two three"], 2, 0, 0, 2, 0.5)


def test_dpo_keeps_the_reference_frozen_and_starts_at_log_2(tiny):
    before = state(tiny)
    kl_prompts = chat_data().instructions.heldout[:3]
    run = dpo(tiny, small_pairs(), beta=0.5, steps=3, seed=0, lr=1e-2, batch_size=2, eval_at=(2,),
              kl_instructions=kl_prompts, plays_windows=4)
    assert same(state(tiny), before)  # the SFT model is untouched
    assert same(state(run.reference), before)  # the reference is the SFT model, unchanged by training
    assert not any(p.requires_grad for p in run.reference.parameters())
    assert not same(state(run.policy), before)
    assert run.log[0]["loss"] == pytest.approx(math.log(2), abs=1e-6)  # the policy is the reference
    assert run.log[0]["rewards/margins"] == pytest.approx(0.0, abs=1e-5)  # float32 sums: -1.9e-6 on default
    assert [e["step"] for e in run.evals] == [0, 2, 3]
    assert run.evals[0]["kl"] == pytest.approx(0.0, abs=1e-6) and run.evals[-1]["kl"] > 1e-6
    assert set(run.log[-1]) == {"loss", "rewards/chosen", "rewards/rejected", "rewards/margins",
                                "rewards/accuracies"}


def test_dpo_refuses_no_pairs_and_a_bad_beta(tiny):
    empty = Pairs([], [], [], 3, 3, 0, 2, 1.0)
    with pytest.raises(ValueError, match="nothing to prefer"):
        dpo(tiny, empty)
    with pytest.raises(ValueError, match="beta"):
        dpo(tiny, small_pairs(), beta=0)


def test_kl_from_reference_is_zero_for_the_same_model_and_matches_a_token_by_token_sum(tiny):
    xs = chat_data().instructions.heldout[:2]
    assert kl_from_reference(tiny, copy.deepcopy(tiny), xs) == pytest.approx(0.0, abs=1e-6)
    other = copy.deepcopy(tiny)
    with torch.no_grad():
        other.lm_head.weight.mul_(1.5)
    kl = kl_from_reference(other, tiny, xs, seed=4, max_new_tokens=5)
    # the same answers, drawn again, and the KL summed one position at a time
    from course_lib.chat import generate_replies

    template = chat_data().template
    replies = generate_replies(other, template, [x.prompt for x in xs], 5, temperature=1.0,
                               generator=torch.Generator().manual_seed(4))
    total = 0.0
    with torch.no_grad():
        for x, r in zip(xs, replies):
            prompt = template.prompt(x.prompt)
            ids = torch.tensor([prompt + r.ids])
            p, q = other(ids)[0].log_softmax(-1), tiny(ids)[0].log_softmax(-1)  # (T, V)
            for t in range(len(prompt) - 1, ids.size(1) - 1):
                total += torch.sum(p[t].exp() * (p[t] - q[t])).item()
    assert kl == pytest.approx(total / len(xs), rel=1e-5)


def test_evaluate_and_plays_loss_on_a_tiny_model(tiny):
    xs = chat_data().instructions.heldout[:4]
    out = evaluate(tiny, xs, samples=3, max_new_tokens=4)
    assert "all" in out["score"] and len(out["answers"]) == 12 and 0 <= out["stopped"] <= 1
    assert evaluate(tiny, xs, samples=3, max_new_tokens=4)["answers"] == out["answers"]  # seeded draws
    greedy = evaluate(tiny, xs, samples=None, max_new_tokens=4)
    assert len(greedy["answers"]) == 4
    assert set(out["by_play"]) <= set(chat_data().instructions.heldout_plays)
    assert plays_loss(tiny, windows=4) > 0
    wrong = GPT(GPTConfig(vocab_size=10, max_len=MAX_LEN, d_model=16, num_heads=2, num_layers=1))
    with pytest.raises(ValueError, match="train_chat_base"):
        evaluate(wrong, xs)


def test_train_chat_base_grows_the_template_ids():
    base = train_chat_base(seed=0, max_len=16, steps=2)
    assert base.config.vocab_size == chat_data().template.vocab_size and base.config.max_len == 16
    assert not base.training


def test_stored_runs_round_trip(tmp_path):
    runs = [{"seed": 0, "base": {}, "sft": {}, "sft_unmasked": {}, "pairs": {}, "dpo": []}]
    save_instruct_results(runs, tmp_path)
    loaded = load_instruct_results(tmp_path)
    (block,) = loaded["paths"].values()
    assert block["runs"] == runs
    save_instruct_results([{"seed": 0}], tmp_path)
    with pytest.raises(ValueError, match="make instruct"):
        load_instruct_results(tmp_path)


def test_the_benchmark_line_has_issue_52s_format():
    import importlib.util
    import re
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "dpo.py"
    spec = importlib.util.spec_from_file_location("dpo_benchmark", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    runs = [{"seed": s, "base": {"heldout": {"all": 0.0}}, "sft": {"heldout": {"all": 0.2 + s / 100}, "seconds": 60.0},
             "pairs": {"pairs": 400, "instructions": 1024},
             "dpo": [{"beta": 0.1, "heldout": {"all": 0.25}, "seconds": 20.0, "evals": [{"kl": 1.0}]}]}
            for s in range(3)]
    line = bench.benchmark_line(runs, 0.1)
    assert line == ("dpo: judge score base 0.0%, SFT 21.0%, DPO 25.0% on 300 held-out instructions (beta 0.1); "
                    "SFT 60 s, DPO 20 s")
    assert re.fullmatch(r"dpo: judge score base \S+, SFT \S+, DPO \S+ on \d+ held-out instructions "
                        r"\(beta \S+\); SFT \d+ s, DPO \d+ s", line)
    assert len(bench.per_seed(runs, 0.1)) == 3
