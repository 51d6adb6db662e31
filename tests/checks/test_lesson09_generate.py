"""Lesson-09 sampling loop's checker (course_lib/checks/lesson09_generate.py): correct answers in several
styles pass, each named mistake is caught."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from _helpers import passes, solution_namespace

from course_lib.checks import CheckFailure, check_attention_port, check_generate, check_gpt_forward


# ----------------------------------------------------------------------------------------------
# build (★★): the generation loop, against GPT.generate
# ----------------------------------------------------------------------------------------------


def _gen(crop="last", where=-1, temp="divide", topk="ge", sample="multinomial", use_gen=True,
         steps=0, prompt=True):
    """A learner's sampling loop with one chosen mistake (the defaults are right)."""

    def my_generate(model, ids, max_new_tokens, temperature=1.0, top_k=None, generator=None):
        out = ids
        L = model.config.max_len
        for _ in range(max_new_tokens + steps):
            context = {"last": out[:, -L:], "first": out[:, :L], "none": out}[crop]
            with torch.no_grad():
                logits = model(context)[:, where]
            if temp == "divide":
                logits = logits / temperature
            elif temp == "multiply":
                logits = logits * temperature
            if top_k is not None and topk != "ignored":
                values = torch.topk(logits, top_k).values
                if topk == "ge":
                    logits = logits.masked_fill(logits < values[:, -1:], float("-inf"))
                elif topk == "gt":
                    logits = logits.masked_fill(logits <= values[:, -1:], float("-inf"))
                elif topk == "zero":
                    logits = logits.masked_fill(logits < values[:, -1:], 0.0)
            probs = logits.softmax(-1)
            if temp == "probs":  # temperature on the probabilities: no effect after normalising
                probs = probs / temperature
            if sample == "greedy":
                nxt = probs.argmax(-1, keepdim=True)
            elif sample == "logits":
                nxt = torch.multinomial(logits, 1, generator=generator)
            else:
                nxt = torch.multinomial(probs, 1, generator=generator if use_gen else None)
            out = torch.cat([out, nxt], dim=1)
        return out if prompt else out[:, ids.size(1):]

    return my_generate


def test_generate_right_answer_passes(capsys):
    assert passes(check_generate, _gen())
    assert "check_generate: all 4 cases match" in capsys.readouterr().out


def test_generate_other_styles_pass():
    """Temperature after top-k (the same tokens: dividing by T > 0 keeps the order), one sequence
    at a time, a Python list of ids, float64 logits; and lesson 07's filter_logits."""
    from course_lib.decoding import filter_logits

    def one_at_a_time(model, ids, max_new_tokens, temperature=1.0, top_k=None, generator=None):
        rows = []
        for row in ids:
            out = row.tolist()
            for _ in range(max_new_tokens):
                with torch.no_grad():
                    logits = model(torch.tensor([out[-model.config.max_len:]]))[0, -1].double()
                if top_k is not None:
                    kth = logits.sort(descending=True).values[top_k - 1]
                    logits[logits < kth] = -math.inf
                probs = torch.softmax(logits / temperature, dim=-1)
                out.append(int(torch.multinomial(probs.float(), 1, generator=generator)))
            rows.append(out)
        return torch.tensor(rows)

    def with_filter(model, ids, max_new_tokens, temperature=1.0, top_k=None, generator=None):
        for _ in range(max_new_tokens):
            logits = model(ids[:, -model.config.max_len:])[:, -1].detach()
            probs = filter_logits(logits / temperature, top_k).softmax(-1)
            ids = torch.cat([ids, torch.multinomial(probs, 1, generator=generator)], 1)
        return ids

    for fn in (one_at_a_time, with_filter, _gen()):
        assert passes(check_generate, fn)


@pytest.mark.parametrize(
    "mistake, words",
    [
        ({"crop": "none"}, "feed only the last max_len tokens"),
        ({"crop": "first"}, "cropped to the FIRST max_len"),
        ({"where": 0}, "first position"),
        ({"temp": "multiply"}, "multiplied by the temperature"),
        ({"temp": "ignored"}, "temperature changes nothing"),
        ({"temp": "probs"}, "temperature changes nothing"),
        ({"topk": "ignored"}, "top_k changes nothing"),
        ({"topk": "gt"}, "keeps top_k - 1"),
        ({"topk": "zero"}, "set to 0, not -inf"),
        ({"sample": "greedy"}, "argmax"),
        ({"sample": "logits"}, "not a probability distribution"),
        ({"use_gen": False}, "do not come from `generator`"),
        ({"steps": 1}, "1 too many"),
        ({"steps": -1}, "1 too few"),
        ({"prompt": False}, "only the .* new tokens"),
    ],
)
def test_generate_mistakes(mistake, words):
    with pytest.raises(CheckFailure, match=words):
        check_generate(_gen(**mistake))


def test_generate_a_loop_that_never_ends_is_stopped():
    def my_generate(model, ids, max_new_tokens, temperature=1.0, top_k=None, generator=None):
        out = ids
        while out.size(1) != ids.size(1) + max_new_tokens + 1000:  # never reached fast
            logits = model(out[:, -model.config.max_len:])[:, -1]
            out = torch.cat([out, logits.argmax(-1, keepdim=True)], 1)
        return out

    with pytest.raises(CheckFailure, match="forward passes"):
        check_generate(my_generate)


def test_generate_refuses_the_reference():
    with pytest.raises(CheckFailure, match="calls model.generate"):
        check_generate(lambda model, ids, n, temperature=1.0, top_k=None, generator=None:
                       model.generate(ids, n, temperature, top_k, generator=generator))


def test_generate_stub(capsys):
    def my_generate(model, ids, max_new_tokens, temperature=1.0, top_k=None, generator=None):
        raise NotImplementedError

    check_generate(my_generate)
    assert "not implemented yet" in capsys.readouterr().out


# ----------------------------------------------------------------------------------------------
# issue 38: correct code in other styles, decorated code, shortcuts refused kindly
# ----------------------------------------------------------------------------------------------


def _topk_gather(temp="divide", crop="last", k_extra=0):
    """Top-k by drawing among the k values only, then mapping back with gather (the issue's
    sampler): other draws than GPT.generate's for the same seed, the same distribution."""

    def my_generate(model, ids, max_new_tokens, temperature=1.0, top_k=None, generator=None):
        L = model.config.max_len
        for _ in range(max_new_tokens):
            context = {"last": ids[:, -L:], "minus_one": ids[:, -(L - 1):]}[crop]
            with torch.no_grad():
                logits = model(context)[:, -1]
            logits = logits * temperature if temp == "multiply" else logits / temperature
            if top_k is None:
                nxt = torch.multinomial(logits.softmax(-1), 1, generator=generator)
            else:
                v, ix = logits.topk(top_k + k_extra)
                nxt = ix.gather(-1, torch.multinomial(v.softmax(-1), 1, generator=generator))
            ids = torch.cat([ids, nxt], 1)
        return ids

    return my_generate


def _gumbel_max(model, ids, max_new_tokens, temperature=1.0, top_k=None, generator=None):
    """Sampling by the Gumbel-max trick: argmax of logits + Gumbel noise, one at a time."""
    rows = []
    for row in ids:
        out = row[None]
        for _ in range(max_new_tokens):
            with torch.no_grad():
                logits = model(out[:, -model.config.max_len:])[0, -1].double() / temperature
            if top_k is not None:
                logits[logits < logits.topk(top_k).values[-1]] = -math.inf
            u = torch.rand(logits.shape, generator=generator, dtype=torch.float64)
            out = torch.cat([out, (logits - torch.log(-torch.log(u))).argmax().view(1, 1)], 1)
        rows.append(out)
    return torch.cat(rows)


def test_generate_other_samplers_pass(capsys):
    """Samplers that draw other tokens than GPT.generate for the same seed, but from the right
    distribution, pass: the checker then tests the distribution of 4,000 of their draws."""
    for fn in (_topk_gather(), _gumbel_max):
        assert passes(check_generate, fn)
        out = capsys.readouterr().out
        assert "you sample another way" in out and "follow the model's distribution" in out
        assert "mistake" not in out.lower()


@pytest.mark.parametrize(
    "fn, words",
    [
        (_topk_gather(temp="multiply"), "multiplied by the temperature"),
        (_topk_gather(crop="minus_one"), "last max_len - 1 tokens"),
        (_topk_gather(k_extra=1), "top_k \\+ 1 tokens|probability 0"),
    ],
)
def test_generate_other_samplers_with_a_mistake_are_named(fn, words):
    with pytest.raises(CheckFailure, match=words):
        check_generate(fn)


def test_generate_crop_to_max_len_minus_one_is_named():
    def my_generate(model, ids, max_new_tokens, temperature=1.0, top_k=None, generator=None):
        for _ in range(max_new_tokens):
            logits = model(ids[:, -(model.config.max_len - 1):])[:, -1].detach() / temperature
            if top_k is not None:
                logits[logits < logits.topk(top_k).values[:, -1:]] = -math.inf
            ids = torch.cat([ids, torch.multinomial(logits.softmax(-1), 1, generator=generator)], 1)
        return ids

    with pytest.raises(CheckFailure, match="last max_len - 1 tokens"):
        check_generate(my_generate)


@pytest.mark.parametrize("where", ["threshold", "argmax"])
def test_generate_no_keepdim_is_named(where):
    def my_generate(model, ids, max_new_tokens, temperature=1.0, top_k=None, generator=None):
        for _ in range(max_new_tokens):
            logits = model(ids[:, -model.config.max_len:])[:, -1].detach() / temperature
            if top_k is not None:
                kth = logits.topk(top_k).values[:, -1]  # (B,): no keepdim
                logits = logits.masked_fill(logits < (kth if where == "threshold" else kth[:, None]),
                                            -math.inf)
            probs = logits.softmax(-1)
            nxt = (torch.multinomial(probs, 1, generator=generator) if where == "threshold"
                   else torch.multinomial(probs, 1, generator=generator)[:, 0])  # (B,)
            ids = torch.cat([ids, nxt], 1)
        return ids

    words = "keep its axis: \\(B, 1\\)" if where == "threshold" else "needs the new tokens as \\(B, 1\\)"
    with pytest.raises(CheckFailure, match=words) as info:
        check_generate(my_generate)
    assert "None of the usual" not in str(info.value)


@pytest.mark.parametrize("decorator", [torch.no_grad(), torch.inference_mode()],
                         ids=["no_grad", "inference_mode"])
def test_decorated_solutions_pass(decorator):
    """Every function under @torch.no_grad() shares the decorator's wrapper code; the checkers
    watch course_lib's references by their own bodies (inspect.unwrap), so a decorated solution
    is not taken for a call to GPT.generate or load_into_hf_gpt2."""
    generate = decorator(_gen())
    assert passes(check_generate, generate)
    assert passes(check_generate, decorator(_topk_gather()))
    port = solution_namespace("09.port_attention")["port_attention"]
    assert passes(check_attention_port, decorator(port))
    forward = solution_namespace("09.gpt_forward")["my_gpt_forward"]
    assert passes(check_gpt_forward, torch.no_grad()(forward))


# ----------------------------------------------------------------------------------------------
# h09's first tryout (issue 38): the wrong attempts whose messages were generic, raw or wrong
# ----------------------------------------------------------------------------------------------


def _gen_loop(context="last", total=False, ascending=False):
    def my_generate(model, ids, max_new_tokens, temperature=1.0, top_k=None, generator=None):
        out = ids
        steps = range(max(max_new_tokens - ids.size(1), 0)) if total else range(max_new_tokens)
        for _ in steps:
            source = ids if context == "prompt" else out
            with torch.no_grad():
                logits = model(source[:, -model.config.max_len:])[:, -1] / temperature
            if top_k is not None:
                ordered = logits.sort(-1).values if ascending else logits.sort(-1, descending=True).values
                logits = logits.masked_fill(logits < ordered[:, top_k - 1 : top_k], -math.inf)
            out = torch.cat([out, torch.multinomial(logits.softmax(-1), 1, generator=generator)], 1)
        return out

    return my_generate


@pytest.mark.parametrize(
    "fn, words",
    [
        (_gen_loop(context="prompt"), "reads the prompt at every step"),
        (_gen_loop(total=True), "max_new_tokens counts the NEW tokens"),
        (_gen_loop(ascending=True), "top_k changes nothing.*LARGEST"),
    ],
)
def test_generate_tryout_mistakes_are_named(fn, words):
    with pytest.raises(CheckFailure, match=words):
        check_generate(fn)


def test_generate_a_wrong_sampler_drawn_otherwise_is_not_given_a_near_miss_name():
    """Top-k by gather with the logits divided by temperature cubed: no named mistake fits its
    draws (the likelihood ratio alone would pick the nearest one); the distribution test refuses
    it and says what it sees."""

    def my_generate(model, ids, max_new_tokens, temperature=1.0, top_k=None, generator=None):
        for _ in range(max_new_tokens):
            with torch.no_grad():
                logits = model(ids[:, -model.config.max_len:])[:, -1] / temperature**3
            v, ix = logits.topk(top_k or logits.size(-1))
            ids = torch.cat([ids, ix.gather(-1, torch.multinomial(v.softmax(-1), 1, generator=generator))], 1)
        return ids

    with pytest.raises(CheckFailure, match="do not follow the model's distribution.*picks likelier") as info:
        check_generate(my_generate)
    assert "Likely mistake" not in str(info.value)


# ----------------------------------------------------------------------------------------------
# h09's second tryout (issue 38): the attempts that got the generic line or a wrong name
# ----------------------------------------------------------------------------------------------


def test_generate_logits_averaged_over_positions_are_named():
    def my_generate(model, ids, max_new_tokens, temperature=1.0, top_k=None, generator=None):
        for _ in range(max_new_tokens):
            with torch.no_grad():
                logits = model(ids[:, -model.config.max_len:]).mean(1) / temperature
            if top_k is not None:
                logits[logits < logits.topk(top_k).values[:, -1:]] = -math.inf
            ids = torch.cat([ids, torch.multinomial(logits.softmax(-1), 1, generator=generator)], 1)
        return ids

    with pytest.raises(CheckFailure, match="averaged over all positions"):
        check_generate(my_generate)


# ----------------------------------------------------------------------------------------------
# h09's third tryout (issue 38): the attempts that got the generic line
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mistake, words", [("twice", "divided by the temperature twice"),
                                            ("batch_axis", "softmax runs over the batch axis")])
def test_generate_third_tryout_mistakes_are_named(mistake, words):
    def my_generate(model, ids, max_new_tokens, temperature=1.0, top_k=None, generator=None):
        for _ in range(max_new_tokens):
            with torch.no_grad():
                logits = model(ids[:, -model.config.max_len:])[:, -1] / temperature
            if top_k is not None:
                logits = logits.masked_fill(logits < logits.topk(top_k).values[:, -1:], -math.inf)
                if mistake == "twice":
                    logits = logits / temperature
            probs = F.softmax(logits, dim=0 if mistake == "batch_axis" else -1)
            ids = torch.cat([ids, torch.multinomial(probs, 1, generator=generator)], 1)
        return ids

    with pytest.raises(CheckFailure, match=words):
        check_generate(my_generate)
