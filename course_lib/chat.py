"""A chat template for the course's character GPT (lesson 16): role tokens, a stop token, generation.

A model that continues text becomes an assistant by reading conversations written in one fixed
layout, the chat template. Ours is ChatML's layout with shorter names: every turn is a role token,
the turn's text and the end token,

    <|user|>A line with the word 'crown'.<|end|><|assistant|>Uneasy lies the head that wears a crown.<|end|>

and a prompt for the model to answer ends with ``<|assistant|>`` (Hugging Face's
``add_generation_prompt``). The three tokens are new ids after the tokenizer's own
(``len(tokenizer)``, ``+ 1``, ``+ 2``), never characters; ``render`` refuses text that spells one
out (Hugging Face's tokenizer would read it as the token, ours as characters, and ``to_text`` could
not tell them apart). ``<|end|>`` closing the assistant's turn is the stop token: the answer is
trained to end with it, and generation stops there.

The model needs a row for each new id in its token table and in its output layer.
``grow_embeddings`` adds them as Hugging Face's ``resize_token_embeddings(..., mean_resizing=True)``
does (Hewitt 2021, "Initializing new word embeddings for pretrained language models"): each new row
is the mean of the existing rows. Why the mean: the new token's logit is then ``h · mean(e_i)`` =
the mean of the old logits, which by Jensen's inequality is at most the log of the mean of their
exponentials, so the new tokens take at most ``k / (V + k)`` of the probability and the model's
distribution over its old tokens moves by at most ``KL <= log(1 + k / V)``. A random row can instead
start with any logit, and a large one swamps every prediction of the trained model until training
repairs it. (Hugging Face draws from a normal around the mean with 1e-9 times the rows'
covariance: the mean give or take sqrt(1e-9) of the rows' spread, 6.7e-6 for rows of spread 0.1 in
tests/lib/test_chat.py.)

``generate_replies`` answers several prompts at once and stops each at ``<|end|>``: it reuses the
GPT's KV-cache step (``GPT.step``, lesson 07) and the sampling step of ``course_lib.decoding``
(``next_token``: temperature, top-k, top-p, greedy). Prompts of different lengths need no padding:
every row is fed its own token at the same position, and a row starts drawing once its prompt is
in the cache.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import nn

from .decoding import filter_logits, next_token
from .gpt import GPT

__all__ = ["USER", "ASSISTANT", "END", "SPECIAL_TOKENS", "ROLES", "ChatTemplate", "grow_embeddings",
           "Reply", "generate_until", "generate_replies", "hf_chat_tokenizer"]

USER, ASSISTANT, END = "<|user|>", "<|assistant|>", "<|end|>"
SPECIAL_TOKENS = (USER, ASSISTANT, END)
ROLES = {"user": USER, "assistant": ASSISTANT}


class ChatTemplate:
    """The chat layout over a tokenizer: ``<|role|>text<|end|>`` per turn, as token ids.

    Args:
        tokenizer: anything with ``encode(text) -> list[int]``, ``decode(ids) -> str`` and ``len()``
            (lesson 09's ``CharVocab``, lesson 10's tokenizers).

    Attributes: ``base_vocab_size`` (``len(tokenizer)``), ``user_id``, ``assistant_id``, ``end_id``
    (the three new ids, in that order after the tokenizer's), ``vocab_size`` (``base + 3``: the
    model's ``vocab_size`` after ``grow_embeddings``), ``special_ids`` (token -> id).

    A conversation is a list of messages ``{"role": "user" | "assistant", "content": str}``, the
    format of Hugging Face's chat templates and TRL's conversational data sets.
    """

    def __init__(self, tokenizer) -> None:
        for name in ("encode", "decode", "__len__"):
            if not hasattr(tokenizer, name):
                raise TypeError(f"ChatTemplate: the tokenizer needs encode, decode and len(); "
                                f"{type(tokenizer).__name__} has no {name}")
        self.tokenizer = tokenizer
        self.base_vocab_size = len(tokenizer)
        self.special_ids = {tok: self.base_vocab_size + i for i, tok in enumerate(SPECIAL_TOKENS)}
        self.user_id, self.assistant_id, self.end_id = self.special_ids.values()
        self.vocab_size = self.base_vocab_size + len(SPECIAL_TOKENS)
        self._role_of = {self.user_id: "user", self.assistant_id: "assistant"}

    def __repr__(self) -> str:
        return (f"ChatTemplate({self.base_vocab_size} tokens + {USER}={self.user_id}, "
                f"{ASSISTANT}={self.assistant_id}, {END}={self.end_id})")

    def encode_text(self, text: str, where: str = "ChatTemplate") -> list[int]:
        """A turn's text as the tokenizer's ids; text holding a special token's string is refused."""
        if not isinstance(text, str):
            raise TypeError(f"{where}: a message's content must be a str, got {type(text).__name__}")
        inside = [tok for tok in SPECIAL_TOKENS if tok in text]
        if inside:
            raise ValueError(f"{where}: the text {text!r} contains {inside}, the template's own tokens; "
                             "text cannot open or end a turn (remove them from the text)")
        ids = list(self.tokenizer.encode(text))
        if any(not 0 <= int(i) < self.base_vocab_size for i in ids):
            raise ValueError(f"{where}: the tokenizer gave ids outside its {self.base_vocab_size} tokens")
        return [int(i) for i in ids]

    def render(self, conversation: Sequence[dict], add_generation_prompt: bool = False) -> list[int]:
        """Conversation -> ids: ``<|role|> text <|end|>`` for each message, then ``<|assistant|>`` if
        ``add_generation_prompt`` (the prompt the model answers)."""
        if isinstance(conversation, (str, dict)) or not isinstance(conversation, Sequence):
            raise TypeError("ChatTemplate.render: conversation must be a list of {'role', 'content'} "
                            f"messages, got {type(conversation).__name__}")
        ids: list[int] = []
        for i, message in enumerate(conversation):
            if not isinstance(message, dict) or set(message) != {"role", "content"}:
                raise ValueError(f"ChatTemplate.render: message {i} must be a dict with exactly the keys "
                                 f"'role' and 'content', got {message!r}")
            if message["role"] not in ROLES:
                raise ValueError(f"ChatTemplate.render: message {i} has role {message['role']!r}; the "
                                 f"roles are {list(ROLES)}")
            ids.append(self.special_ids[ROLES[message["role"]]])
            ids += self.encode_text(message["content"], f"ChatTemplate.render (message {i})")
            ids.append(self.end_id)
        if add_generation_prompt:
            ids.append(self.assistant_id)
        return ids

    def prompt(self, instruction: str) -> list[int]:
        """The ids the model answers: ``<|user|>instruction<|end|><|assistant|>``."""
        return self.render([{"role": "user", "content": instruction}], add_generation_prompt=True)

    def example(self, instruction: str, answer: str) -> tuple[list[int], list[int]]:
        """``(prompt ids, answer ids)``: ``prompt(instruction)`` and ``answer`` + ``<|end|>``;
        together they are ``render`` of the two-turn conversation."""
        return self.prompt(instruction), self.encode_text(answer, "ChatTemplate.example") + [self.end_id]

    def parse(self, ids: Sequence[int]) -> list[dict]:
        """The inverse of ``render`` (without a generation prompt): ids -> messages. Every turn must
        open with a role token and close with ``<|end|>``; anything else is an error that says where."""
        ids = [int(i) for i in ids]
        messages, i = [], 0
        while i < len(ids):
            if ids[i] not in self._role_of:
                raise ValueError(f"ChatTemplate.parse: position {i} should open a turn with {USER} or "
                                 f"{ASSISTANT}, got id {ids[i]}")
            try:
                end = ids.index(self.end_id, i + 1)
            except ValueError:
                raise ValueError(f"ChatTemplate.parse: the turn opened at position {i} never ends with "
                                 f"{END} (an unfinished answer? to_text shows any ids)") from None
            body = ids[i + 1 : end]
            stray = [t for t in body if t >= self.base_vocab_size]
            if stray:
                raise ValueError(f"ChatTemplate.parse: the turn at position {i} holds the special id "
                                 f"{stray[0]} inside its text")
            messages.append({"role": self._role_of[ids[i]], "content": self.tokenizer.decode(body)})
            i = end + 1
        return messages

    def to_text(self, ids: Sequence[int]) -> str:
        """Any ids as text for display, the special tokens written as ``<|user|>``, ``<|end|>``..."""
        names = {i: tok for tok, i in self.special_ids.items()}
        out, run = [], []
        for i in (int(t) for t in ids):
            if i in names:
                out.append(self.tokenizer.decode(run) if run else "")
                out.append(names[i])
                run = []
            elif 0 <= i < self.base_vocab_size:
                run.append(i)
            else:
                raise ValueError(f"ChatTemplate.to_text: id {i} is outside the {self.vocab_size} ids")
        out.append(self.tokenizer.decode(run) if run else "")
        return "".join(out)

    def jinja(self) -> str:
        """The same template as a Hugging Face ``chat_template`` (Jinja), for ``hf_chat_tokenizer``."""
        return ("{% for message in messages %}{{ '<|' + message['role'] + '|>' + message['content'] + "
                "'<|end|>' }}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}")


@torch.no_grad()
def grow_embeddings(model: GPT, num_new_tokens: int) -> GPT:
    """Give ``model`` ``num_new_tokens`` more token ids, in place; returns ``model``.

    The token table ``(V, d_model)`` becomes ``(V + k, d_model)`` and the output layer ``(V, d_model)``
    ``(V + k, d_model)``; rows ``0 .. V-1`` are kept, each new row is the mean of the old rows (of the
    token table, and separately of an untied output layer). A tied model stays tied. Grow before
    building the optimizer: the grown tables are new parameters.
    """
    if not isinstance(model, GPT):
        raise TypeError(f"grow_embeddings: needs course_lib's GPT, got {type(model).__name__}")
    if isinstance(num_new_tokens, bool) or not isinstance(num_new_tokens, int) or num_new_tokens < 1:
        raise ValueError(f"grow_embeddings: num_new_tokens must be an int >= 1, got {num_new_tokens!r}")
    old = model.embed.token.embedding
    V, d = old.weight.shape
    table = nn.Embedding(V + num_new_tokens, d, device=old.weight.device, dtype=old.weight.dtype)
    table.weight[:V] = old.weight
    table.weight[V:] = old.weight.mean(dim=0)  # (d,) broadcast to (k, d)
    tied = model.lm_head.weight is old.weight
    head = nn.Linear(d, V + num_new_tokens, bias=False, device=old.weight.device, dtype=old.weight.dtype)
    if tied:
        head.weight = table.weight  # still one (V + k, d) matrix
    else:
        head.weight[:V] = model.lm_head.weight
        head.weight[V:] = model.lm_head.weight.mean(dim=0)
    table.weight.requires_grad_(old.weight.requires_grad)
    head.weight.requires_grad_(model.lm_head.weight.requires_grad)
    model.embed.token.embedding = table
    model.embed.token.vocab_size = V + num_new_tokens
    model.lm_head = head
    model.config = dataclasses.replace(model.config, vocab_size=V + num_new_tokens)
    return model


class Reply(NamedTuple):
    """One generated answer: ``text`` (without the stop token), its ``ids`` (with the stop token if
    it came) and ``stopped`` (False: the budget or the context ran out first)."""

    text: str
    ids: list[int]
    stopped: bool


@torch.no_grad()
def generate_until(
    model: GPT,
    prompts: Sequence[Sequence[int]],
    stop_id: int,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
    greedy: bool = False,
) -> list[list[int]]:
    """Continue each prompt (a list of ids; lengths may differ) until it produces ``stop_id``.

    Returns one list of new ids per prompt, ending with ``stop_id`` if it came within
    ``max_new_tokens`` and the model's ``max_len`` positions. All rows go through ``GPT.step``
    together, position by position (row b is fed its prompt's token while it lasts, then its own
    last token), and each draw is ``decoding.next_token`` on the rows that are answering. One prompt
    gives the tokens of ``model.generate`` with the same generator, cut after the stop token.
    """
    if not isinstance(model, GPT):
        raise TypeError(f"generate_until: needs course_lib's GPT, got {type(model).__name__}")
    if isinstance(prompts, torch.Tensor):
        prompts = prompts.tolist()
    if isinstance(prompts, Sequence) and not isinstance(prompts, (str, bytes)):
        prompts = [p.tolist() if isinstance(p, torch.Tensor) else p for p in prompts]
    if isinstance(prompts, (str, bytes)) or not prompts or not all(
            isinstance(p, Sequence) and len(p) > 0 for p in prompts):
        raise ValueError("generate_until: prompts must be a non-empty list of non-empty lists of ids")
    rows = [[int(t) for t in p] for p in prompts]
    V, max_len = model.config.vocab_size, model.config.max_len
    if not (isinstance(stop_id, int) and 0 <= stop_id < V):
        raise ValueError(f"generate_until: stop_id must be an id of the model (0..{V - 1}), got {stop_id!r} "
                         "(grow the model's embeddings for the chat template's tokens first)")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"generate_until: max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
    if not greedy:  # refuse a bad temperature, top_k or top_p before any work, as GPT.generate does
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not (
                math.isfinite(temperature) and temperature > 0):
            raise ValueError(f"generate_until: temperature must be a finite number > 0, got {temperature!r} "
                             "(greedy=True takes the argmax)")
        filter_logits(torch.zeros(1, 1), top_k, top_p)
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(f"generate_until: generator must be a torch.Generator, got {type(generator).__name__}")
    longest = max(len(p) for p in rows)
    if longest > max_len:
        raise ValueError(f"generate_until: a prompt has {longest} tokens, more than the model's max_len="
                         f"{max_len}; shorten it")
    if any(t < 0 or t >= V for p in rows for t in p):
        raise ValueError(f"generate_until: prompt ids must lie in [0, {V - 1}]")
    lengths = [len(p) for p in rows]
    new: list[list[int]] = [[] for _ in rows]
    done = [False] * len(rows)
    device = model.lm_head.weight.device
    was_training = model.training
    model.eval()
    try:
        cache = model.start_cache(len(rows))
        for t in range(max_len):
            feed = [seq[t] if t < n else (out[t - n] if t - n < len(out) else stop_id)
                    for seq, n, out in zip(rows, lengths, new)]  # a finished row is fed stop_id
            logits = model.step(torch.tensor(feed, device=device), cache)  # (B, V)
            answering = [b for b in range(len(rows)) if t >= lengths[b] - 1 and not done[b]]
            if not answering:
                continue
            if not torch.isfinite(logits[answering]).all():
                raise ValueError("generate_until: the model's logits contain NaN or inf; its weights are "
                                 "not finite (did training diverge?)")
            drawn = next_token(logits[answering], temperature, top_k, top_p, generator, greedy)  # (A,)
            for b, token in zip(answering, drawn.tolist()):
                new[b].append(token)
                done[b] = token == stop_id or len(new[b]) == max_new_tokens
            if all(done):
                break
    finally:
        model.train(was_training)
    return new


def generate_replies(
    model: GPT,
    template: ChatTemplate,
    instructions: Sequence[str],
    max_new_tokens: int = 80,
    **sampling,
) -> list[Reply]:
    """Answer each instruction: ``template.prompt(instruction)``, then ``generate_until`` the end
    token. ``sampling``: ``temperature``, ``top_k``, ``top_p``, ``generator``, ``greedy``."""
    if isinstance(instructions, str):
        raise TypeError("generate_replies: instructions must be a list of str, got one str")
    if model.config.vocab_size != template.vocab_size:
        raise ValueError(f"generate_replies: the model has {model.config.vocab_size} token ids, the template "
                         f"{template.vocab_size}; grow_embeddings(model, 3) first")
    prompts = [template.prompt(text) for text in instructions]
    replies = []
    for ids in generate_until(model, prompts, template.end_id, max_new_tokens, **sampling):
        stopped = bool(ids) and ids[-1] == template.end_id
        body = ids[:-1] if stopped else ids
        replies.append(Reply(template.to_text(body), ids, stopped))
    return replies


def hf_chat_tokenizer(template: ChatTemplate):
    """The template as a Hugging Face ``PreTrainedTokenizerFast`` (built locally, nothing downloaded),
    for TRL's trainers: one token per character with the ``CharVocab``'s ids, the three special
    tokens with the template's ids (``eos_token`` and ``pad_token`` = ``<|end|>``) and
    ``template.jinja()`` as its ``chat_template``, so ``apply_chat_template`` gives ``render``'s ids."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    itos = [template.tokenizer.decode([i]) for i in range(template.base_vocab_size)]
    if any(len(s) != 1 for s in itos) or len(set(itos)) != len(itos):
        raise ValueError("hf_chat_tokenizer: the template's tokenizer must have one distinct character "
                         "per id (a CharVocab without special tokens, as lesson 09's corpus builds)")
    vocab = {ch: i for i, ch in enumerate(itos)} | template.special_ids
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=None))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # every character
    core.decoder = decoders.Fuse()  # join the characters without spaces
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, eos_token=END, pad_token=END,
                                        additional_special_tokens=[USER, ASSISTANT])
    tokenizer.chat_template = template.jinja()
    return tokenizer
