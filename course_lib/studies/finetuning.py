"""Lesson 15's measured fine-tunings: lesson 09's GPT, trained on the plays, adapted to the poems by
training everything, the head, the last block, LayerNorms and biases (BitFit) or LoRA adapters
(``make finetuning`` stores them per float path; the lesson loads them instead of training them live).

    base, plays = load_base()                    # lesson 09's GPT as train_base(seed=0) trains it
    base, plays = train_base()                   # the same, trained again (~30 s on one core)
    run = finetune(base, "lora", r=4)            # a copy of base, 300 steps on the poems
    run.poems_val[-1], run.plays_val[-1]         # validation losses after the last step
    load_finetuning_results()["paths"]["avx512"] # {"modes": [...], "full": [...], "ranks": [...]}

The data: the plays corpus (``ShakespeareCorpus()``, split by play) and the poems
(``course_lib.data.shakespeare.read_poems``, split by poem: "A Lover's Complaint" and sonnets 10, 20,
..., 150 held out), both read with the plays' character vocabulary. Every fine-tuning uses the
benchmark's schedule (``benchmarks/lora.py``): batches of ``COURSE.batch_size`` windows of
``COURSE.block_size`` characters drawn by a generator seeded with ``seed``, 10% linear warm-up then a
cosine down to 0.1 of the peak rate, AdamW with betas (0.9, 0.99) and weight decay 0.1 on matrices
only (``lm_optimizer``), gradients clipped at a total norm of 1.0. The validation losses are measured
on fixed windows (512 of the held-out poems, 512 of the held-out plays, seed 0), the same for every
run.

What each mode trains (``MODES``; the model has 1 layer, so the last block is most of it):
- ``"full"``: every parameter (217,344);
- ``"head"``: the output layer ``lm_head.weight`` only (83 x 128 = 10,624; tied to the token
  embedding, so the input embedding moves with it);
- ``"last_block"``: every parameter of the last block (``blocks.layers[-1]``: 198,272);
- ``"bitfit"``: every LayerNorm weight and every bias (Ben Zaken et al. 2021 train the biases; 1,920);
- ``"lora"``: ``A`` and ``B`` of ``add_lora(model, r, alpha, rslora=...)`` on q, k, v, out_proj,
  linear1 and linear2 (r = 4: 9,216), ``alpha`` = 2r by default.

The peak rates (``LR``): for each mode the lowest poems loss after 300 steps in a sweep, seed 0,
1 thread, AVX-512 (2026-12-07); poems / plays validation loss after 300 steps at each rate, from the base's
1.8445 / 1.8482:
- full: 3e-4 1.7413 / 1.9088, 1e-3 1.7141 / 1.9491, **3e-3 1.7016 / 2.0237**, 1e-2 1.7175 / 2.1192;
- head: 1e-3 1.7901 / 1.9073, 3e-3 1.7836 / 1.9415, **1e-2 1.7816 / 1.9885**, 3e-2 1.7861 / 2.0351;
- last_block: 3e-4 1.7473 / 1.8999, 1e-3 1.7190 / 1.9306, **3e-3 1.6994 / 1.9851**, 1e-2 1.7159 / 2.0602;
- bitfit: 3e-3 1.8105 / 1.8704, **1e-2 1.8054 / 1.8879**, 3e-2 1.8056 / 1.8994, 1e-1 1.8093 / 1.9166
  (1e-2 and 3e-2 tie to 0.0002);
- lora (r = 4, alpha = 8): 3e-3 1.7702 / 1.9187, **1e-2 1.7646 / 1.9449**, 3e-2 1.7702 / 1.9521.
Every mode's best rate sits inside its grid, and a higher rate forgets more of the plays in every mode.
"""

from __future__ import annotations

import copy
import datetime
import functools
import hashlib
import io
import json
import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import torch
from torch import nn

from ..attention import set_fused_attention
from ..data.shakespeare import VALIDATION_POEMS, ShakespeareCorpus, read_poems
from ..gpt import GPT, GPTConfig, lm_loss
from ..lm_training import COURSE, evaluate_lm, lm_optimizer, train_lm, warmup_cosine
from ..lora import add_lora, lora_parameters
from .stored import RESULTS_DIR, float_path

__all__ = ["MODES", "LR", "VAL_WINDOWS", "RANKS", "RANK_SCALINGS", "FinetuneRun", "corpora",
           "validation_batches", "train_base", "mode_parameters", "state_bytes", "finetune",
           "PARTS", "run_finetuning_study", "save_finetuning_results", "load_finetuning_results",
           "FORMAT_VERSION", "BASE_FILE", "BASE_SHA256", "BASE_FLOAT_PATH", "file_sha256", "save_model_file",
           "load_model_file", "save_base", "load_base"]

MODES = ("full", "head", "last_block", "bitfit", "lora")
LR = {"full": 3e-3, "head": 1e-2, "last_block": 3e-3, "bitfit": 1e-2, "lora": 1e-2}
VAL_WINDOWS = 512
RANKS = (1, 2, 4, 8, 16, 32)
# The rank study's three ways to set LoRA's scale, all equal (2) at r = 4, the modes' LoRA:
# "alpha=2r": alpha / r = 2 at every rank (the benchmark's choice); "alpha=8": alpha fixed at r = 4's
# value, so alpha / r = 8 / r shrinks as r grows (Hu et al.'s practice: alpha tuned once, then fixed);
# "rslora": alpha / sqrt(r) with alpha = 4, so 4 / sqrt(r) (Kalajdzievski 2023's rank-stabilised scale).
RANK_SCALINGS = {"alpha=2r": lambda r: (2.0 * r, False), "alpha=8": lambda r: (8.0, False),
                 "rslora": lambda r: (4.0, True)}
FORMAT_VERSION = 1
RESULTS_NAME = "finetuning"


@dataclass
class FinetuneRun:
    """One fine-tuning: the validation losses at ``steps`` (step 0 = the base, before training).

    ``poems_val[i]``, ``plays_val[i]``: mean next-character loss (nats) on the fixed held-out poems
    and plays windows after ``steps[i]`` updates. ``trainable``: parameters the optimizer updates;
    ``total``: the model's parameters (the base's, without adapters); ``optimizer_bytes``: bytes of
    AdamW's state after training (``exp_avg``, ``exp_avg_sq``, ``step``); ``step_seconds``: median
    seconds of a training step (forward, backward, clip, update; the machine's load changes it).
    ``model``: the fine-tuned copy (not stored in the results file).
    """

    mode: str
    steps: list[int]
    poems_val: list[float]
    plays_val: list[float]
    trainable: int
    optimizer_bytes: int
    step_seconds: float
    seed: int
    lr: float
    num_steps: int
    r: int | None = None
    alpha: float | None = None
    rslora: bool = False
    total: int = 0
    batch_size: int = COURSE.batch_size
    block_size: int = COURSE.block_size
    model: nn.Module | None = field(default=None, repr=False, compare=False)

    def to_dict(self, digits: int = 6) -> dict:
        """The run as JSON-ready numbers (losses rounded to ``digits``), without the model."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "model"}
        out["poems_val"] = [round(x, digits) for x in self.poems_val]
        out["plays_val"] = [round(x, digits) for x in self.plays_val]
        out["step_seconds"] = round(self.step_seconds, 6)
        return out


@functools.lru_cache(maxsize=1)
def corpora() -> tuple[ShakespeareCorpus, ShakespeareCorpus]:
    """``(plays, poems)``: the plays corpus (split by play) and the poems (split by poem,
    ``VALIDATION_POEMS``), both with the plays' character vocabulary (read once, then cached)."""
    plays = ShakespeareCorpus()
    poems = ShakespeareCorpus(VALIDATION_POEMS, plays=read_poems(), tokenizer=plays.vocab)
    return plays, poems


def validation_batches(num_windows: int = VAL_WINDOWS, block_size: int = COURSE.block_size
                       ) -> dict[str, list[tuple[torch.Tensor, torch.Tensor]]]:
    """``{"poems": batches, "plays": batches}``: ``num_windows`` fixed windows (seed 0) of each
    held-out text, as ``(x (B, T), y (B, T))`` batches of at most 64."""
    plays, poems = corpora()
    return {"poems": poems.fixed_batches("val", num_windows, block_size),
            "plays": plays.fixed_batches("val", num_windows, block_size)}


def train_base(seed: int = 0) -> tuple[GPT, ShakespeareCorpus]:
    """Lesson 09's GPT trained on the 33 training plays with ``COURSE`` (1 layer, d_model 128, 700
    steps of 32 windows of 64 characters): ``(model in eval mode, the plays corpus)``. About 20 s
    on 2 quiet cores; the same weights on every run of a float path."""
    plays, _ = corpora()
    return train_lm(plays, COURSE, seed=seed, progress=False).model, plays


BASE_FILE = RESULTS_DIR / "finetuning_base.pt"
# The sha256 of the stored file: train_base(seed=0), 1 thread, float path BASE_FLOAT_PATH, torch 2.13.0.
BASE_SHA256 = "ba0e2961028616fead1195bc2df19e20af94ce58aeeda407a4d4004ae7f668fd"
BASE_FLOAT_PATH = "avx512"


def file_sha256(path: Path | str) -> str:
    """The sha256 of the file at ``path``, as 64 hex digits."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def save_model_file(model: GPT, path: Path | str, **meta) -> str:
    """Write ``{"config": asdict(model.config), "state_dict": ..., **meta}`` to ``path`` and return the
    file's sha256. ``meta``: what made the weights (float path, recipe, steps, seed, ...): numbers,
    strings, lists and dicts of them. The bytes depend only on the contents (not on ``path``'s name),
    so the same weights give the same file and the same sha256."""
    buffer = io.BytesIO()  # saved from memory: torch.save names the archive after a file's name
    torch.save({"config": asdict(model.config), "state_dict": model.state_dict(), **meta}, buffer)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(buffer.getvalue())
    return file_sha256(path)


def load_model_file(path: Path | str, sha256: str, make: str, who: str) -> tuple[GPTConfig, dict, dict]:
    """``(config, state_dict, meta)`` from ``save_model_file``'s file at ``path``, once its sha256 is
    ``sha256``. A missing file, or one whose sha256 differs (a partial download, another run's
    weights), raises an error that says to run ``make {make}`` (``who``: the function that asks)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{who}: the trained model {path} is missing; run `make {make}` to train and "
                                "write it (or get the file again from the course's repository)")
    found = file_sha256(path)
    if found != sha256:
        raise ValueError(f"{who}: {path} is not the stored model (sha256 {found[:12]}..., expected "
                         f"{sha256[:12]}...); run `make {make}` to write it again (or get the file again "
                         "from the course's repository)")
    saved = torch.load(path, map_location="cpu", weights_only=True)
    config = GPTConfig(**saved.pop("config"))
    return config, saved.pop("state_dict"), saved


def save_base(path: Path | str = BASE_FILE, seed: int = 0) -> tuple[Path, str]:
    """Train ``train_base(seed)`` on this machine's threads and float path and store it at ``path``
    with the seed, the recipe, the float path, the threads and the torch version; returns ``(path,
    sha256)``. ``make bases`` runs it with 1 thread: on float path ``BASE_FLOAT_PATH`` it writes the
    file ``BASE_SHA256`` names again, bit for bit."""
    model, _ = train_base(seed)
    sha = save_model_file(model, path, function=f"train_base(seed={seed})", seed=seed, recipe=asdict(COURSE),
                          steps=COURSE.num_steps, float_path=float_path(), threads=torch.get_num_threads(),
                          torch=str(torch.__version__))
    return Path(path), sha


def load_base(path: Path | str | None = None, sha256: str | None = None) -> tuple[GPT, ShakespeareCorpus]:
    """What ``train_base(seed=0)`` returns, from the stored file: ``(model in eval mode, the plays
    corpus)``, the weights those of 1 thread on float path ``BASE_FLOAT_PATH``. It builds the model as
    training does (``torch.manual_seed(seed)``, then ``GPT(config)``), so torch's global generator is
    left where training leaves it and a lesson's later random draws are the same. The file's sha256
    must be ``sha256``; else a clear error says to run `make bases`. Defaults: ``BASE_FILE`` and
    ``BASE_SHA256``, read when called."""
    config, state_dict, meta = load_model_file(BASE_FILE if path is None else path,
                                               BASE_SHA256 if sha256 is None else sha256, "bases", "load_base")
    plays, _ = corpora()
    torch.manual_seed(meta["seed"])  # as train_lm: the same draws for the initial weights
    model = GPT(config)
    model.load_state_dict(state_dict)
    return model.eval(), plays


def _check_int(value, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"finetune: {name} must be an int >= {minimum}, got {value!r}")
    return value


def mode_parameters(model: nn.Module, mode: str) -> dict[str, nn.Parameter]:
    """The parameters ``mode`` trains in ``model`` (a ``GPT``, with LoRA layers for ``"lora"``), by
    name; a tied matrix once. See the module's docstring for each mode."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    named = dict(model.named_parameters())  # a tied matrix once, under its first name
    if mode == "full":
        return named
    if mode == "head":
        head = model.lm_head.weight
        return {n: p for n, p in named.items() if p is head}
    if mode == "last_block":
        prefix = f"blocks.layers.{len(model.blocks.layers) - 1}."
        return {n: p for n, p in named.items() if n.startswith(prefix)}
    if mode == "bitfit":
        norms = {id(p) for m in model.modules() if isinstance(m, nn.LayerNorm) for p in m.parameters()}
        return {n: p for n, p in named.items() if n.endswith(".bias") or id(p) in norms}
    ids = {id(p) for p in lora_parameters(model)}
    return {n: p for n, p in named.items() if id(p) in ids}


def state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """The bytes of every tensor in the optimizer's state (AdamW: exp_avg, exp_avg_sq, step)."""
    return sum(t.numel() * t.element_size() for s in optimizer.state.values() for t in s.values()
               if isinstance(t, torch.Tensor))


def finetune(base: GPT, mode: str, steps: int = 300, lr: float | None = None, seed: int = 0, r: int = 4,
             alpha: float | None = None, rslora: bool = False, eval_every: int = 25, *,
             val_windows: int = VAL_WINDOWS, batch_size: int = COURSE.batch_size,
             block_size: int = COURSE.block_size) -> FinetuneRun:
    """Fine-tune a copy of ``base`` on the poems; ``base`` itself is left as it was.

    Args:
        base: lesson 09's GPT (``train_base()``), with the plays' character vocabulary.
        mode: what trains, one of ``MODES`` (the module's docstring says which parameters).
        steps: AdamW updates; each on ``batch_size`` random windows ``(B, T = block_size)`` of the
            training poems.
        lr: peak rate (default ``LR[mode]``, chosen by the sweep in the module's docstring).
        seed: seeds the batches and, for LoRA, ``A``'s initialisation (``torch.manual_seed``).
        r, alpha, rslora: LoRA's rank and scale (``alpha`` default 2r; ``rslora``: alpha / sqrt(r));
            ignored by the other modes.
        eval_every: measure both validation losses at step 0, every ``eval_every`` steps and after
            the last step (0: at step 0 and the end only).
        val_windows: fixed windows of each held-out text to evaluate on (the study: 512).
    """
    if not isinstance(base, GPT):
        raise TypeError(f"finetune: base must be a course_lib GPT (train_base()), got {type(base).__name__}")
    if mode not in MODES:
        raise ValueError(f"finetune: mode must be one of {MODES}, got {mode!r}")
    _check_int(steps, "steps", 1)
    _check_int(eval_every, "eval_every", 0)
    for name, value in (("val_windows", val_windows), ("batch_size", batch_size), ("block_size", block_size)):
        _check_int(value, name, 1)
    _check_int(seed, "seed", 0)
    lr = LR[mode] if lr is None else lr
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not (math.isfinite(lr) and lr > 0):
        raise ValueError(f"finetune: lr must be a finite number > 0, got {lr!r}")
    plays, poems = corpora()
    if base.config.vocab_size != len(plays.vocab):
        raise ValueError(f"finetune: base has a vocabulary of {base.config.vocab_size}, the plays' "
                         f"characters are {len(plays.vocab)}; fine-tune a model trained on them")
    val = validation_batches(val_windows, block_size)
    model = copy.deepcopy(base)
    total = sum(p.numel() for p in model.parameters())
    lora = mode == "lora"
    if lora:
        _check_int(r, "r", 1)
        alpha = 2.0 * r if alpha is None else alpha
        torch.manual_seed(seed)  # A's initialisation
        add_lora(model, r, alpha, rslora=rslora)
    chosen = mode_parameters(model, mode)
    for p in model.parameters():
        p.requires_grad_(False)
    for p in chosen.values():
        p.requires_grad_(True)
    params = list(chosen.values())
    optimizer = lm_optimizer(model, lr, COURSE.betas, COURSE.weight_decay)
    warmup = max(1, steps // 10) if steps > 1 else 0
    gen = torch.Generator().manual_seed(seed)
    run = FinetuneRun(mode, [], [], [], sum(p.numel() for p in params), 0, 0.0, seed, lr, steps,
                      r if lora else None, float(alpha) if lora else None, rslora if lora else False,
                      total, batch_size, block_size, model)

    def evaluate(step: int) -> None:
        run.steps.append(step)
        run.poems_val.append(evaluate_lm(model, val["poems"]))
        run.plays_val.append(evaluate_lm(model, val["plays"]))

    set_fused_attention(model, True)
    try:
        evaluate(0)
        model.train()
        seconds = []
        for step in range(steps):
            x, y = poems.train_batch(batch_size, block_size, gen)  # (B, T) each
            start = time.perf_counter()
            for group in optimizer.param_groups:
                group["lr"] = lr * warmup_cosine(step, warmup, steps, 0.1)
            loss = lm_loss(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            seconds.append(time.perf_counter() - start)
            if step + 1 == steps or (eval_every and (step + 1) % eval_every == 0):
                evaluate(step + 1)
    finally:
        set_fused_attention(model, False)
        model.eval()
    run.optimizer_bytes = state_bytes(optimizer)
    run.step_seconds = statistics.median(seconds)
    return run


PARTS = ("modes", "ranks")


def run_finetuning_study(seeds: Sequence[int] = (0, 1, 2), steps: int = 300, ranks: Sequence[int] = RANKS,
                         base: GPT | None = None, progress: bool = True, parts: Sequence[str] = PARTS,
                         **kwargs) -> dict:
    """The stored study: ``{"modes": [...], "full": [...], "ranks": [...]}`` of ``FinetuneRun.to_dict()``.

    ``"modes"``: every mode of ``MODES`` (LoRA r = 4, alpha 8), each seed, evaluated every 25 steps.
    ``"full"``: full fine-tuning at the same steps and seeds, the reference (the modes' full runs).
    ``"ranks"``: LoRA at each rank of ``ranks`` under each scale rule of ``RANK_SCALINGS`` (each run
    carries ``"scaling_rule"``), each seed, evaluated at step 0 and the end; at r = 4 the three rules
    give the same scale (2), so one run per seed, marked ``"scaling_rule": "all"`` (the same training
    as the modes' LoRA run: its final losses equal that run's). ``parts``: which of ``PARTS`` to run
    (processes can share the work, by part and by ``ranks``; ``save_finetuning_results`` merges
    what each stores). The base is
    ``train_base(0)`` for every run; ``kwargs`` go to ``finetune`` (tests: small sizes).
    """
    unknown = set(parts) - set(PARTS)
    if unknown or not parts:
        raise ValueError(f"run_finetuning_study: parts must be some of {PARTS}, got {list(parts)}")
    base = train_base(0)[0] if base is None else base
    out: dict[str, list[dict]] = {}

    def say(run: FinetuneRun, what: str) -> None:
        if progress:
            print(f"  {what} seed {run.seed}: poems {run.poems_val[-1]:.4f}, plays {run.plays_val[-1]:.4f}, "
                  f"{run.trainable:,} trainable, {1000 * run.step_seconds:.0f} ms/step", flush=True)

    if "modes" in parts:
        out["modes"], out["full"] = [], []
        for mode in MODES:
            for seed in seeds:
                run = finetune(base, mode, steps, seed=seed, r=4, **kwargs)
                out["modes"].append(run.to_dict())
                say(run, mode)
                if mode == "full":
                    out["full"].append(run.to_dict())
    if "ranks" in parts:
        out["ranks"] = []
        for r in ranks:
            rules = {"all": RANK_SCALINGS["alpha=2r"]} if r == 4 else RANK_SCALINGS
            for rule, scale in rules.items():
                alpha, rs = scale(r)
                for seed in seeds:
                    run = finetune(base, "lora", steps, seed=seed, r=r, alpha=alpha, rslora=rs,
                                   eval_every=0, **kwargs)
                    out["ranks"].append(dict(run.to_dict(), scaling_rule=rule))
                    say(run, f"lora r={r} {rule}")
    return out


def save_finetuning_results(study: dict, folder: Path | str = RESULTS_DIR) -> Path:
    """Store ``study`` (``run_finetuning_study``'s, all parts or some) in ``folder/finetuning.json``
    under this CPU's float path, with the torch version, the threads and the date; the path's other
    parts and the other paths are kept. One run per line, for readable diffs."""
    path = Path(folder) / f"{RESULTS_NAME}.json"
    results = json.loads(path.read_text()) if path.is_file() else {"version": FORMAT_VERSION, "paths": {}}
    if results.get("version") != FORMAT_VERSION:
        results = {"version": FORMAT_VERSION, "paths": {}}
    capability = float_path()
    entry = results["paths"].get(capability, {})
    entry.update({"torch": torch.__version__, "threads": torch.get_num_threads(),
                  "date": datetime.date.today().isoformat(), "lr": LR})
    entry.update({k: study[k] for k in ("modes", "full") if k in study})
    if "ranks" in study:  # merged run by run: processes may each run some ranks
        rules = ["all", *RANK_SCALINGS]
        key = lambda run: (run["r"], rules.index(run["scaling_rule"]), run["seed"])  # noqa: E731
        runs = {key(run): run for run in entry.get("ranks", []) + study["ranks"]}
        entry["ranks"] = [runs[k] for k in sorted(runs)]
    results["paths"][capability] = entry
    blocks = []
    for key, entry in sorted(results["paths"].items()):
        lists = [k for k in ("modes", "full", "ranks") if k in entry]
        head = ", ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in entry.items() if k not in lists)
        body = ",\n".join(f"   {json.dumps(k)}: [\n" + ",\n".join("    " + json.dumps(r) for r in entry[k])
                          + "\n   ]" for k in lists)
        blocks.append(f"  {json.dumps(key)}: {{{head}" + (f",\n{body}" if lists else "") + "}")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'{{"version": {FORMAT_VERSION}, "paths": {{\n' + ",\n".join(blocks) + "\n}}\n")
    return path


RUN_KEYS = {"mode", "steps", "poems_val", "plays_val", "trainable", "optimizer_bytes", "step_seconds",
            "seed", "lr", "num_steps", "r", "alpha", "rslora", "total"}


def load_finetuning_results(folder: Path | str = RESULTS_DIR) -> dict:
    """What ``make finetuning`` stored: ``{"version": 1, "paths": {path: {"torch", "threads",
    "date", "lr", "modes": [run, ...], "ranks": [...], "full": [...]}}}``, each run a
    ``FinetuneRun.to_dict()`` (rank runs add ``"scaling_rule"``). Checked: the format version, each
    path's keys and torch version, each run's keys and matching curve lengths; a clear error says
    what to run when the file is missing or not this format."""
    path = Path(folder) / f"{RESULTS_NAME}.json"
    if not path.is_file():
        raise FileNotFoundError(f"load_finetuning_results: no results at {path}; run `make finetuning` "
                                "to write them")
    try:
        results = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"load_finetuning_results: {path} is not JSON ({error}); run `make finetuning` "
                         "again") from None
    if not isinstance(results, dict) or results.get("version") != FORMAT_VERSION:
        found = results.get("version") if isinstance(results, dict) else None
        raise ValueError(f"load_finetuning_results: {path} has format version {found!r}, this course_lib "
                         f"reads version {FORMAT_VERSION}; run `make finetuning` again")
    paths = results.get("paths")
    if not isinstance(paths, dict) or not paths:
        raise ValueError(f"load_finetuning_results: {path} holds no float path; run `make finetuning`")
    for name, entry in paths.items():
        missing = {"torch", "threads", "date", "modes", "ranks", "full"} - set(entry)
        if missing:
            raise ValueError(f"load_finetuning_results: {path}, path {name!r} lacks {sorted(missing)}; "
                             "run `make finetuning` again")
        if not (isinstance(entry["torch"], str) and entry["torch"][:1].isdigit()):
            raise ValueError(f"load_finetuning_results: {path}, path {name!r}: no torch version; "
                             "run `make finetuning` again")
        for kind in ("modes", "ranks", "full"):
            for run in entry[kind]:
                lacks = RUN_KEYS - set(run)
                if lacks or not len(run["steps"]) == len(run["poems_val"]) == len(run["plays_val"]):
                    raise ValueError(f"load_finetuning_results: {path}, path {name!r}, a {kind} run is "
                                     f"malformed (missing {sorted(lacks)} or curves of unequal length)")
    return results
