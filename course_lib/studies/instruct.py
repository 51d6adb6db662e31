"""Lesson 16's measured runs: the plays model taught to follow instructions (SFT), then to prefer the
answers the judge accepts (DPO), scored by the judge on held-out instructions (``make instruct``
stores them per float path; the lesson loads them instead of training them live).

    data = chat_data()                               # instructions, the plays corpus, the chat template
    base = load_chat_base()                          # train_chat_base(seed=0), stored (`make bases`)
    base = train_chat_base(seed=0)                   # the same, trained again (about a minute on one core)
    run = sft(base, steps=SFT_STEPS)                 # a copy of base, the loss on the answers only
    evaluate(run.model, data.instructions.heldout)   # {"score": {...}, "stopped": ..., "by_play": {...}}
    pairs = preference_pairs(run.model, pair_instructions(), samples=4, seed=0)
    d = dpo(run.model, pairs, beta=0.1, steps=DPO_STEPS, seed=0)
    d.log[-1], d.evals[-1]                           # loss, rewards, accuracy; score, KL, plays' loss

The base: lesson 09's GPT (``COURSE``: 1 layer, d_model 128, 4 heads) trained on the 33 training
plays with ``COURSE``'s recipe but windows of ``max_len`` = 128 characters (a rendered example is up
to ~110 tokens: ``<|user|>`` + a prompt of up to 45 characters + ``<|end|><|assistant|>`` + a line of
up to 60 + ``<|end|>``), then ``grow_embeddings(model, 3)`` for the template's three tokens (rows the
mean of the old rows). Lesson 09's own model has 64 positions: too few. The study trains one base
(seed 0) and varies the seed of everything after it (SFT's batches, the sampled answers, DPO's
batches). The stored base (``course_lib/results/instruct_base.pt``, ``make bases``) is what
``train_chat_base(seed=0)`` returns with one thread on float path ``CHAT_BASE_FLOAT_PATH``, with its
config, recipe, seed, float path and torch version; ``load_chat_base`` checks its sha256 against
``CHAT_BASE_SHA256``.

The data (``course_lib.data.instructions.InstructionSet(seed=0)``): SFT trains on the training
instructions except the last ``DEV`` (the dev split: every setting here was chosen on it, never on the
held-out sets); preference pairs are sampled for the ``PAIR_INSTRUCTIONS`` instructions before the dev
split (training instructions SFT saw: DPO needs no new prompts, only the SFT model's own answers).
Scored on ``heldout`` (300 instructions from the 4 held-out plays, 100 per trained kind, their words
never a training instruction's word) and ``heldout_kind`` (100 ``ends`` instructions, a kind training
never asks for), by the judge (``course_lib.data.instructions.judge``) on **sampled** answers:
``EVAL_SAMPLES`` per instruction at temperature 1, a generator seeded with 0 (the share estimates the
chance that one answer drawn from the model passes, the quantity DPO moves); greedy answers are
scored too (``*_greedy``: one answer per instruction, so a model's score jumps with a few flipped
answers). Answers have at most ``MAX_NEW_TOKENS`` tokens; one that never produces ``<|end|>`` is
judged on what it wrote.

The settings, chosen on the dev split (seed 0, 1 thread, AVX-512, 2026-12-07; dev scores over all
kinds): SFT 400 steps of 32 at peak rate 1e-3 (greedy 17.0%, sampled 16.3%; plays' loss 1.787 ->
2.112) against 3e-3 (greedy 7.3%; plays' loss 2.452). DPO at beta 0.1 from that SFT model on 451
pairs (of 1,024 instructions): rate 1e-4, sampled score 16.3% -> 19.8% / 22.4% / 20.9% after 20 / 40 /
60 steps of a 60-step run (KL 0.45 / 1.03 / 1.18 nats per answer); a 100-step run at 1e-4 reached KL
3.1 and its greedy score fell below SFT's (9.0%), at 3e-4 KL 14 after 100 steps: 60 steps at 1e-4.

The stored run (``make instruct``, AVX-512, seeds 0-2; mean [min, max]), the share of sampled
answers accepted on the 300 instructions held out by play: base 0.1% (it never stops: 2% of its
replies end with ``<|end|>``); SFT 16.6% [15.4, 18.7] (without masking 13.5% [12.4, 14.6]); DPO
19.2% [17.8, 20.5] at beta 0.05, 19.1% [17.8, 20.3] at 0.1, 18.0% [17.7, 18.4] at 0.5. On the 100
``ends`` instructions (the held-out kind) every model scores 0-0.3%. The plays' loss: base 1.787,
SFT 2.112 (unmasked 2.215), DPO 2.139-2.154; KL from the reference after 60 steps 1.08-1.35 nats
per answer at beta 0.05 and 0.1, 0.62-0.78 at 0.5. Pairs: 438-476 of 1,024 instructions; 530-569 had
every sample refused, 16-18 every sample accepted. On AVX2: SFT 17.0% [16.2, 17.6] (unmasked 13.9%),
DPO 18.8% / 19.8% / 19.1% at beta 0.05 / 0.1 / 0.5, DPO above SFT on every seed at beta 0.1. On
``default``: base 0.0%, SFT 16.1% [14.2, 17.2] (unmasked 13.9%), DPO 16.8% / 17.4% / 16.9%; seed 2
falls below SFT at beta 0.05 and 0.1 (17.2% -> 16.8%, 16.5%), as on AVX-512 at beta 0.1.

What is measured:
- ``evaluate``: the judge's share per kind and over all, the share of replies that stopped, and the
  share per held-out play;
- ``plays_loss``: the mean next-character loss on ``PLAYS_WINDOWS`` fixed windows of 128 characters of
  the held-out plays (seed 0): forgetting;
- ``kl_from_reference``: KL(π ‖ π_ref) of whole answers, estimated on held-out prompts as the **exact
  per-token KL** of the two next-token distributions summed along an answer **sampled from the
  policy** (temperature 1, seeded), averaged over the prompts. Along a sampled answer the sum of
  per-token KLs is an unbiased estimate of the sequence KL, with less variance than the sampled
  tokens' log-ratio.
"""

from __future__ import annotations

import copy
import functools
import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from ..attention import set_fused_attention
from ..chat import SPECIAL_TOKENS, ChatTemplate, generate_replies, grow_embeddings
from ..data.instructions import SPECIAL_MARK, Instruction, InstructionSet, judge, score
from ..data.shakespeare import ShakespeareCorpus
from ..dpo import chosen_rejected_log_probs, dpo_loss, preference_batch, reward_metrics
from ..gpt import GPT
from ..lm_training import COURSE, evaluate_lm, lm_optimizer, train_lm, warmup_cosine
from ..sft import sft_batch, sft_example, sft_loss
from .finetuning import load_model_file, save_model_file
from .stored import RESULTS_DIR, float_path, load_runs, save_runs

__all__ = ["MAX_LEN", "DEV", "EVAL_SAMPLES", "PAIR_INSTRUCTIONS", "MAX_NEW_TOKENS", "PLAYS_WINDOWS", "SFT_STEPS",
           "SFT_LR", "SFT_BATCH", "DPO_STEPS", "DPO_LR", "DPO_BATCH", "BETAS", "SAMPLES", "ChatData", "chat_data",
           "train_chat_base", "plays_loss", "evaluate", "SFTRun", "sft", "Pairs", "preference_pairs",
           "pair_instructions", "DPORun", "dpo", "kl_from_reference", "study_seed", "run_instruct_study",
           "save_instruct_results", "load_instruct_results", "mean_spread", "RESULTS_NAME", "CHAT_BASE_FILE",
           "CHAT_BASE_SHA256", "CHAT_BASE_FLOAT_PATH", "save_chat_base", "load_chat_base"]

MAX_LEN = 128
DEV = 300  # the last training instructions: the dev split, for choosing settings
PAIR_INSTRUCTIONS = 1024  # training instructions whose sampled answers make the preference pairs
MAX_NEW_TOKENS = 72  # a line is at most 60 characters; the longest prompt (48 ids) + 72 fits in 128
PLAYS_WINDOWS = 256
EVAL_SAMPLES = 4  # sampled answers per held-out instruction (temperature 1)
SFT_STEPS, SFT_LR, SFT_BATCH = 400, 1e-3, 32
DPO_STEPS, DPO_LR, DPO_BATCH = 60, 1e-4, 16
BETAS = (0.05, 0.1, 0.5)
SAMPLES = 4
RESULTS_NAME = "instruct"
CHAT_BASE_FILE = RESULTS_DIR / "instruct_base.pt"
# The sha256 of the stored file: train_chat_base(seed=0), 1 thread, float path CHAT_BASE_FLOAT_PATH, torch 2.13.0.
CHAT_BASE_SHA256 = "27f51dc21ca276e79fb132c464f31d4b33e8f83a35df18f8b59f036349d0e3ba"
CHAT_BASE_FLOAT_PATH = "avx512"


@dataclass(frozen=True)
class ChatData:
    """What every run reads: ``instructions`` (``InstructionSet(seed=0)``), the plays ``corpus``
    (its character vocabulary is the tokenizer) and the chat ``template`` over it."""

    instructions: InstructionSet
    corpus: ShakespeareCorpus
    template: ChatTemplate

    @property
    def sft_train(self) -> list[Instruction]:
        """The training instructions SFT learns from (all but the dev split)."""
        return self.instructions.train[:-DEV]

    @property
    def dev(self) -> list[Instruction]:
        """The dev split: the last ``DEV`` training instructions, never trained on."""
        return self.instructions.train[-DEV:]


@functools.lru_cache(maxsize=1)
def chat_data() -> ChatData:
    """The instructions, the plays corpus and the template (built once, then cached)."""
    corpus = ShakespeareCorpus()
    return ChatData(InstructionSet(seed=0), corpus, ChatTemplate(corpus.vocab))


def pair_instructions() -> list[Instruction]:
    """The ``PAIR_INSTRUCTIONS`` training instructions before the dev split (DPO's prompts)."""
    return chat_data().sft_train[-PAIR_INSTRUCTIONS:]


def _int(value, name: str, where: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{where}: {name} must be an int >= {minimum}, got {value!r}")
    return value


def _rate(value, name: str, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value > 0):
        raise ValueError(f"{where}: {name} must be a finite number > 0, got {value!r}")
    return float(value)


def _check_chat_model(model, where: str) -> GPT:
    template = chat_data().template
    if not isinstance(model, GPT):
        raise TypeError(f"{where}: needs course_lib's GPT, got {type(model).__name__}")
    if model.config.vocab_size != template.vocab_size or model.config.max_len < MAX_LEN:
        raise ValueError(f"{where}: the model must have the template's {template.vocab_size} ids and "
                         f">= {MAX_LEN} positions (train_chat_base), got {model.config.vocab_size} ids and "
                         f"{model.config.max_len} positions")
    return model


def train_chat_base(seed: int = 0, max_len: int = MAX_LEN, steps: int = COURSE.num_steps) -> GPT:
    """Lesson 09's GPT trained on the training plays with ``COURSE`` at ``max_len`` positions
    (windows of ``max_len`` characters), then grown by the template's 3 ids; eval mode."""
    _int(max_len, "max_len", "train_chat_base", 2)
    _int(steps, "steps", "train_chat_base", 2)
    recipe = replace(COURSE, block_size=max_len, num_steps=steps, warmup=min(COURSE.warmup, steps - 1))
    model = train_lm(chat_data().corpus, recipe, seed=seed, progress=False).model
    return grow_embeddings(model, len(SPECIAL_TOKENS)).eval()


def save_chat_base(path: Path | str = CHAT_BASE_FILE, seed: int = 0) -> tuple[Path, str]:
    """Train ``train_chat_base(seed)`` on this machine's threads and float path and store it at
    ``path`` with the seed, the recipe (``COURSE`` at ``MAX_LEN`` positions), the float path, the
    threads and the torch version; returns ``(path, sha256)``. ``make bases`` runs it with 1 thread:
    on float path ``CHAT_BASE_FLOAT_PATH`` it writes the file ``CHAT_BASE_SHA256`` names again."""
    model = train_chat_base(seed)
    recipe = replace(COURSE, block_size=MAX_LEN)
    sha = save_model_file(model, path, function=f"train_chat_base(seed={seed})", seed=seed, recipe=asdict(recipe),
                          steps=recipe.num_steps, new_tokens=len(SPECIAL_TOKENS), float_path=float_path(),
                          threads=torch.get_num_threads(), torch=str(torch.__version__))
    return Path(path), sha


def load_chat_base(path: Path | str | None = None, sha256: str | None = None) -> GPT:
    """What ``train_chat_base(seed=0)`` returns, from the stored file (eval mode; the weights of 1
    thread on float path ``CHAT_BASE_FLOAT_PATH``). It builds the model as training does
    (``torch.manual_seed(seed)``, ``GPT`` with the plays' characters, then ``grow_embeddings``), so
    torch's global generator is left where training leaves it and a lesson's later random draws are
    the same. The file's sha256 must be ``sha256``; else a clear error says to run `make bases`.
    Defaults: ``CHAT_BASE_FILE`` and ``CHAT_BASE_SHA256``, read when called."""
    config, state_dict, meta = load_model_file(CHAT_BASE_FILE if path is None else path,
                                               CHAT_BASE_SHA256 if sha256 is None else sha256, "bases",
                                               "load_chat_base")
    torch.manual_seed(meta["seed"])  # as train_lm: the same draws for the initial weights
    model = GPT(replace(config, vocab_size=config.vocab_size - meta["new_tokens"]))
    model = grow_embeddings(model, meta["new_tokens"])  # (V, d) -> (V + 3, d), drawing as training did
    model.load_state_dict(state_dict)
    return model.eval()


@functools.lru_cache(maxsize=2)
def _plays_windows(num: int, block: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return chat_data().corpus.fixed_batches("val", num, block)


def plays_loss(model: GPT, windows: int = PLAYS_WINDOWS) -> float:
    """Mean next-character loss (nats) on ``windows`` fixed windows of ``MAX_LEN`` characters of the
    held-out plays (the same windows for every model): how much of the plays a model keeps."""
    return evaluate_lm(model, _plays_windows(windows, min(MAX_LEN, model.config.max_len)))


def evaluate(model: GPT, instructions: Sequence[Instruction], samples: int | None = EVAL_SAMPLES, seed: int = 0,
             max_new_tokens: int = MAX_NEW_TOKENS) -> dict:
    """The judge on ``model``'s answers: ``samples`` answers per instruction drawn at temperature 1
    (a generator seeded with ``seed``: the same draws for the same model), or the greedy answer with
    ``samples=None``. Returns ``{"score": {kind: share, ..., "all": share}, "stopped": share of
    replies ending with <|end|>, "by_play": {play: share}, "answers": [str]}`` (shares over every
    answer: with samples, an estimate of the chance that one sampled answer passes)."""
    _check_chat_model(model, "evaluate")
    if not instructions:
        raise ValueError("evaluate: no instructions")
    k = 1 if samples is None else _int(samples, "samples", "evaluate")
    xs = [x for x in instructions for _ in range(k)]  # k in a row per instruction
    sampling = {"greedy": True} if samples is None else {
        "temperature": 1.0, "generator": torch.Generator().manual_seed(seed)}
    replies = generate_replies(model, chat_data().template, [x.prompt for x in xs], max_new_tokens, **sampling)
    answers = [r.text for r in replies]
    by_play: dict[str, list[bool]] = {}
    for x, a in zip(xs, answers):
        by_play.setdefault(x.play, []).append(judge(x, a))
    return {"score": score(xs, answers),
            "stopped": sum(r.stopped for r in replies) / len(replies),
            "by_play": {p: sum(v) / len(v) for p, v in sorted(by_play.items())},
            "answers": answers}


@dataclass
class SFTRun:
    """``sft``'s result: the fine-tuned ``model`` (eval mode), every step's loss, the seconds of the
    training steps, and the settings."""

    model: GPT
    losses: list[float]
    seconds: float
    mask_prompt: bool
    steps: int
    lr: float
    batch_size: int
    seed: int


def _train_mode(model: GPT) -> None:
    model.train()
    set_fused_attention(model, True)


def _eval_mode(model: GPT) -> None:
    set_fused_attention(model, False)
    model.eval()


def sft(base: GPT, steps: int = SFT_STEPS, mask_prompt: bool = True, seed: int = 0, lr: float = SFT_LR,
        batch_size: int = SFT_BATCH, instructions: Sequence[Instruction] | None = None) -> SFTRun:
    """Supervised fine-tuning of a copy of ``base`` (``base`` is left as it was).

    Each step: ``batch_size`` instructions drawn at random (a generator seeded with ``seed``) from
    ``instructions`` (default ``chat_data().sft_train``), each with its reference line as the
    answer, ``sft_example`` -> ``sft_batch`` (padded with ``<|end|>``, label -100) -> ``sft_loss``:
    the loss on the answer and its ``<|end|>`` only with ``mask_prompt``, on every token without.
    AdamW (``lm_optimizer``: betas (0.9, 0.99), weight decay 0.1 on matrices), 10% linear warm-up then
    a cosine to 0.1 of ``lr``, gradients clipped at 1.0.
    """
    _check_chat_model(base, "sft")
    _int(steps, "steps", "sft")
    _int(batch_size, "batch_size", "sft")
    lr = _rate(lr, "lr", "sft")
    data = chat_data()
    pool = list(data.sft_train if instructions is None else instructions)
    if not pool:
        raise ValueError("sft: no instructions to train on")
    model = copy.deepcopy(base)
    for p in model.parameters():
        p.requires_grad_(True)
    optimizer = lm_optimizer(model, lr, (0.9, 0.99), 0.1)
    warmup = max(1, steps // 10) if steps > 1 else 0
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: warmup_cosine(s, warmup, steps, 0.1))
    gen = torch.Generator().manual_seed(seed)
    losses = []
    _train_mode(model)
    start = time.perf_counter()
    for _ in range(steps):
        picks = torch.randint(len(pool), (batch_size,), generator=gen).tolist()
        examples = [sft_example(data.template, pool[i].prompt, pool[i].reference, mask_prompt) for i in picks]
        ids, labels = sft_batch(examples, data.template.end_id)  # (B, T), (B, T)
        loss = sft_loss(model(ids), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
    seconds = time.perf_counter() - start
    _eval_mode(model)
    return SFTRun(model, losses, seconds, mask_prompt, steps, lr, batch_size, seed)


@dataclass
class Pairs:
    """Preference pairs: ``instructions[i]`` with a ``chosen[i]`` answer the judge accepts and a
    ``rejected[i]`` it refuses (both sampled from the same model). ``total``: instructions sampled;
    ``all_pass`` / ``all_fail``: instructions with no pair because every sample passed (a refused
    answer holding a template token aside) / failed;
    ``samples``: answers sampled per instruction; ``pass_rate``: the share of all samples that pass."""

    instructions: list[Instruction]
    chosen: list[str]
    rejected: list[str]
    total: int
    all_pass: int
    all_fail: int
    samples: int
    pass_rate: float

    def __len__(self) -> int:
        return len(self.instructions)

    def counts(self) -> dict:
        """The numbers the lesson reports (JSON-ready)."""
        return {"pairs": len(self), "instructions": self.total, "all_pass": self.all_pass,
                "all_fail": self.all_fail, "samples": self.samples, "pass_rate": round(self.pass_rate, 6)}


def preference_pairs(model: GPT, instructions: Sequence[Instruction], samples: int = SAMPLES, seed: int = 0,
                     temperature: float = 1.0, max_new_tokens: int = MAX_NEW_TOKENS) -> Pairs:
    """Sample ``samples`` answers per instruction from ``model`` (temperature ``temperature``, a
    generator seeded with ``seed``), judge them, and keep per instruction the first accepted answer
    as chosen and the first refused one as rejected; an instruction whose samples all pass or all
    fail gives no pair. A refused answer holding a template token (``<|...``) cannot be written back
    into a conversation (``render`` refuses it), so it is not used as the rejected one."""
    _check_chat_model(model, "preference_pairs")
    _int(samples, "samples", "preference_pairs", 2)
    if not instructions or not all(isinstance(x, Instruction) for x in instructions):
        raise ValueError("preference_pairs: instructions must be a non-empty list of Instruction")
    gen = torch.Generator().manual_seed(seed)
    prompts = [x.prompt for x in instructions for _ in range(samples)]  # k in a row per instruction
    replies = generate_replies(model, chat_data().template, prompts, max_new_tokens, temperature=temperature,
                               generator=gen)
    out = Pairs([], [], [], len(instructions), 0, 0, samples, 0.0)
    passed_total = 0
    for i, x in enumerate(instructions):
        texts = [r.text for r in replies[i * samples: (i + 1) * samples]]
        verdicts = [judge(x, t) for t in texts]
        passed_total += sum(verdicts)
        good = [t for t, v in zip(texts, verdicts) if v]
        bad = [t for t, v in zip(texts, verdicts) if not v and SPECIAL_MARK not in t]
        if good and bad:
            out.instructions.append(x)
            out.chosen.append(good[0])
            out.rejected.append(bad[0])
        elif good:  # every answer that could be written back passed
            out.all_pass += 1
        else:
            out.all_fail += 1
    out.pass_rate = passed_total / len(prompts)
    return out


@torch.no_grad()
def kl_from_reference(policy: GPT, reference: GPT, instructions: Sequence[Instruction], seed: int = 0,
                      max_new_tokens: int = MAX_NEW_TOKENS) -> float:
    """KL(π ‖ π_ref) per answer (nats): for each prompt one answer sampled from ``policy``
    (temperature 1, seeded), the exact KL of the two next-token distributions at each of its tokens
    (the end token included), summed over the answer; the mean over ``instructions``."""
    template = chat_data().template
    gen = torch.Generator().manual_seed(seed)
    replies = generate_replies(policy, template, [x.prompt for x in instructions], max_new_tokens,
                               temperature=1.0, generator=gen)
    limit = policy.config.max_len  # a reply that ran to the last position loses its last token's KL
    rows = [(template.prompt(x.prompt) + r.ids)[:limit] for x, r in zip(instructions, replies)]
    T = max(len(r) for r in rows)
    ids = torch.full((len(rows), T), template.end_id, dtype=torch.long)
    answer = torch.zeros(len(rows), T, dtype=torch.bool)  # positions whose next token is an answer token
    for b, (x, r) in enumerate(zip(instructions, replies)):
        ids[b, : len(rows[b])] = torch.tensor(rows[b])
        n = len(template.prompt(x.prompt))
        answer[b, n - 1: len(rows[b]) - 1] = True
    policy.eval()
    reference.eval()
    log_p = policy(ids).log_softmax(-1)  # (N, T, V)
    log_q = reference(ids).log_softmax(-1)  # (N, T, V)
    per_token = (log_p.exp() * (log_p - log_q)).sum(-1)  # (N, T): KL(p || q) of each next-token choice
    return (per_token * answer).sum(1).mean().item()


@dataclass
class DPORun:
    """``dpo``'s result: the trained ``policy`` and the frozen ``reference`` (eval mode); ``log``: per
    step the batch's ``loss`` and TRL's ``rewards/chosen``, ``rewards/rejected``, ``rewards/margins``,
    ``rewards/accuracies``; ``evals``: at the steps of ``eval_at``, ``{"step", "kl", "plays_loss"}``
    (and ``"score"`` if ``heldout`` was given); ``seconds``: of the training steps only."""

    policy: GPT
    reference: GPT
    beta: float
    steps: int
    lr: float
    batch_size: int
    seed: int
    log: list[dict] = field(default_factory=list)
    evals: list[dict] = field(default_factory=list)
    seconds: float = 0.0


def dpo(sft_model: GPT, pairs: Pairs, beta: float = 0.1, steps: int = DPO_STEPS, seed: int = 0,
        lr: float = DPO_LR, batch_size: int = DPO_BATCH, eval_at: Sequence[int] = (),
        kl_instructions: Sequence[Instruction] | None = None,
        heldout: Sequence[Instruction] | None = None, plays_windows: int = PLAYS_WINDOWS) -> DPORun:
    """DPO from ``sft_model``: the reference is a frozen copy of it (no gradient, never updated), the
    policy another copy, trained on ``pairs`` with ``dpo_loss`` (sigmoid, ``beta``) on the sequence
    log-probabilities of both (``preference_batch`` -> ``chosen_rejected_log_probs``; the
    reference's under ``torch.no_grad``). Each step takes ``batch_size`` pairs drawn at random (a
    generator seeded with ``seed``); AdamW with betas (0.9, 0.99), no weight decay, 10% linear warm-up
    then a cosine to 0.1 of ``lr``, gradients clipped at 1.0 (``sft_model`` is left as it was).

    At step 0 (before training), at each step of ``eval_at`` and after the last step it measures the
    KL from the reference on ``kl_instructions`` (``kl_from_reference``), the plays' loss and, with
    ``heldout``, the judge's score there (``evaluate``); that time is not in ``seconds``.
    """
    _check_chat_model(sft_model, "dpo")
    _int(steps, "steps", "dpo")
    _int(batch_size, "batch_size", "dpo")
    lr = _rate(lr, "lr", "dpo")
    beta = _rate(beta, "beta", "dpo")
    if not isinstance(pairs, Pairs) or len(pairs) == 0:
        raise ValueError("dpo: pairs must be a non-empty Pairs (preference_pairs); every sampled answer passed "
                         "or failed alike, so there is nothing to prefer")
    template = chat_data().template
    reference = copy.deepcopy(sft_model).eval()
    for p in reference.parameters():
        p.requires_grad_(False)
    policy = copy.deepcopy(sft_model)
    for p in policy.parameters():
        p.requires_grad_(True)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=lr, betas=(0.9, 0.99), weight_decay=0.0)
    warmup = max(1, steps // 10) if steps > 1 else 0
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: warmup_cosine(s, warmup, steps, 0.1))
    gen = torch.Generator().manual_seed(seed)
    run = DPORun(policy, reference, beta, steps, lr, batch_size, seed)
    checkpoints = {0, steps, *[s for s in eval_at if 0 < s < steps]}

    def measure(step: int) -> None:
        _eval_mode(policy)
        entry = {"step": step, "plays_loss": plays_loss(policy, plays_windows)}
        if kl_instructions:
            entry["kl"] = kl_from_reference(policy, reference, kl_instructions, seed)
        if heldout:
            entry["score"] = evaluate(policy, heldout)["score"]
        run.evals.append(entry)
        _train_mode(policy)

    measure(0)
    seconds = 0.0
    for step in range(1, steps + 1):
        start = time.perf_counter()
        picks = torch.randint(len(pairs), (batch_size,), generator=gen).tolist()
        ids, labels = preference_batch(template, [pairs.instructions[i].prompt for i in picks],
                                       [pairs.chosen[i] for i in picks], [pairs.rejected[i] for i in picks])
        with torch.no_grad():
            ref_c, ref_r = chosen_rejected_log_probs(reference, ids, labels)  # (B,), (B,)
        pol_c, pol_r = chosen_rejected_log_probs(policy, ids, labels)  # (B,), (B,)
        out = dpo_loss(pol_c, pol_r, ref_c, ref_r, beta)
        loss = out.losses.mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        seconds += time.perf_counter() - start
        run.log.append({"loss": loss.item(), **reward_metrics(out.chosen_rewards, out.rejected_rewards)})
        if step in checkpoints:
            measure(step)
    run.seconds = seconds
    _eval_mode(policy)
    return run


def _rounded(x, digits: int = 6):
    if isinstance(x, float):
        return round(x, digits)
    if isinstance(x, dict):
        return {k: _rounded(v, digits) for k, v in x.items()}
    if isinstance(x, list):
        return [_rounded(v, digits) for v in x]
    return x


def _scores(model: GPT) -> dict:
    """Scores on both held-out sets, sampled (``EVAL_SAMPLES`` per instruction, seed 0) and greedy,
    the share of sampled replies that stopped, the share per held-out play, and the plays' loss."""
    data = chat_data()
    held, kind = evaluate(model, data.instructions.heldout), evaluate(model, data.instructions.heldout_kind)
    greedy = evaluate(model, data.instructions.heldout, samples=None)
    greedy_kind = evaluate(model, data.instructions.heldout_kind, samples=None)
    return {"heldout": held["score"], "by_play": held["by_play"], "stopped": held["stopped"],
            "heldout_kind": kind["score"], "heldout_greedy": greedy["score"],
            "heldout_kind_greedy": greedy_kind["score"], "plays_loss": plays_loss(model)}


def study_seed(base: GPT, seed: int, betas: Sequence[float] = BETAS, sft_steps: int = SFT_STEPS,
               dpo_steps: int = DPO_STEPS, samples: int = SAMPLES, num_pairs: int = PAIR_INSTRUCTIONS,
               unmasked: bool = True) -> dict:
    """One seed of the study from ``base``: SFT with the prompt masked (and without, if ``unmasked``),
    the preference pairs sampled from the masked SFT model, DPO from it at each beta. A JSON-ready
    dict: each model's scores (``_scores``), seconds, the pairs' counts, DPO's log every 10 steps and
    its evaluations (step 0, the middle, the end: plays' loss and KL on 100 held-out prompts)."""
    data = chat_data()
    kl_prompts = data.instructions.heldout[::3]  # 100 held-out prompts, every kind
    entry: dict = {"seed": seed}
    for mask in (True, False) if unmasked else (True,):
        run = sft(base, sft_steps, mask_prompt=mask, seed=seed)
        entry["sft" if mask else "sft_unmasked"] = {**_scores(run.model), "seconds": run.seconds,
                                                    "loss": run.losses[9::10]}
        if mask:
            sft_model = run.model
    t0 = time.perf_counter()
    pairs = preference_pairs(sft_model, pair_instructions()[:num_pairs], samples, seed)
    entry["pairs"] = {**pairs.counts(), "seconds": time.perf_counter() - t0}
    entry["dpo"] = []
    for beta in betas:
        d = dpo(sft_model, pairs, beta, dpo_steps, seed, eval_at=(dpo_steps // 2,), kl_instructions=kl_prompts)
        entry["dpo"].append({"beta": beta, **_scores(d.policy), "seconds": d.seconds,
                             "log": d.log[9::10], "evals": d.evals})
    return _rounded(entry)


def _seed_worker(args: tuple) -> dict:
    """``study_seed`` in a worker process, on 1 thread (the lessons' setting)."""
    base_state, config, seed, kwargs = args
    torch.set_num_threads(1)
    base = GPT(config)
    base.load_state_dict(base_state)
    return study_seed(base.eval(), seed, **kwargs)


def run_instruct_study(seeds: Sequence[int] = (0, 1, 2), base_seed: int = 0, base_steps: int = COURSE.num_steps,
                       workers: int = 1, progress: bool = True, **kwargs) -> list[dict]:
    """The study: one base (``train_chat_base(base_seed)``, scored once), then ``study_seed`` for each
    of ``seeds`` (the seed draws SFT's batches, the sampled answers of the pairs and DPO's batches),
    in ``workers`` processes side by side. One dict per seed, each holding the base's scores."""
    t0 = time.perf_counter()
    base = train_chat_base(base_seed, steps=base_steps)
    base_entry = {"seed": base_seed, "steps": base_steps, "seconds": time.perf_counter() - t0, **_scores(base)}
    if progress:
        print(f"base (seed {base_seed}): held-out score {base_entry['heldout']['all']:.3f}, plays loss "
              f"{base_entry['plays_loss']:.4f}, {base_entry['seconds']:.0f} s", flush=True)
    jobs = [(base.state_dict(), base.config, seed, kwargs) for seed in seeds]
    if workers > 1:
        import multiprocessing

        with multiprocessing.get_context("spawn").Pool(min(workers, len(jobs))) as pool:
            runs = pool.map(_seed_worker, jobs)
    else:
        runs = [study_seed(base, seed, **kwargs) for seed in seeds]
    for entry in runs:
        entry["base"] = _rounded(base_entry)
        if progress:
            print(f"seed {entry['seed']}: SFT {entry['sft']['heldout']['all']:.3f}"
                  + (f" (unmasked {entry['sft_unmasked']['heldout']['all']:.3f})" if "sft_unmasked" in entry else "")
                  + ", " + ", ".join(f"DPO beta {d['beta']} {d['heldout']['all']:.3f}" for d in entry["dpo"]),
                  flush=True)
    return runs


def save_instruct_results(runs: list[dict], folder: Path | str = RESULTS_DIR) -> Path:
    """Store the study's runs under this CPU's float path (``course_lib/results/instruct.json``)."""
    return save_runs(RESULTS_NAME, runs, folder)


def load_instruct_results(folder: Path | str = RESULTS_DIR) -> dict:
    """The stored study: ``{"paths": {path: {"runs": [...], ...}}}`` (``make instruct`` writes it)."""
    results = load_runs(RESULTS_NAME, folder, make="instruct")
    for path, block in results["paths"].items():
        for run in block["runs"]:
            missing = {"seed", "base", "sft", "sft_unmasked", "pairs", "dpo"} - set(run)
            if missing:
                raise ValueError(f"load_instruct_results: a run of {path} lacks {sorted(missing)}; rerun "
                                 "`make instruct`")
    return results


def mean_spread(values: Sequence[float]) -> tuple[float, float, float]:
    """``(mean, min, max)`` of ``values``."""
    return statistics.mean(values), min(values), max(values)
