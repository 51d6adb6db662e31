"""course_lib: the finished reference code of the course "Transformers from Scratch".

Every module, by the lessons that build it (first-last: a later lesson may add to an earlier module,
as lesson 11 adds RoPE to attention). A module imports only what a lesson up to its last one builds;
tests/lib/test_package_map.py fails when a module is missing here or breaks that rule. Building blocks:

    00-14  validation     the checks every layer makes of its arguments (sizes, token ids)
    01     masks          boolean masks, True = may attend: padding, causal, decoder
    01-11  attention      scaled dot-product attention, MultiHeadAttention (11: RoPE, grouped-query)
    02     tracing        shape logging while a model runs
    03     embeddings     token embeddings, sinusoidal and learned positions
    04-11  layers         feed-forward, encoder and decoder layers and stacks (11: SwiGLU, RMSNorm)
    00-04  pretrained     real BERT weights (all-MiniLM-L6-v2) in course_lib's encoder, offline
    04-05  model          TransformerConfig, encoder-only models (04), the encoder-decoder Transformer
    06-08  training       loss, schedule, the training loop, the copy-task recipe, the dates recipe (08)
    06-07  decoding       greedy decoding, beam search, sampling
    09-11  gpt            GPT-2's architecture exactly, its Hugging Face port (11: the Llama-style options)
    09     lm_training    training a GPT on characters: recipes, evaluation
    10     tokenization   byte-level BPE, GPT-2's tokenizer, BERT's WordPiece
    11     modern         RMSNorm, SwiGLU, the KV cache's bytes
    11     rope           rotary position embeddings
    11     llama          the Llama-style model and Hugging Face's LlamaForCausalLM, both ways
    12     induction      a 2-layer attention-only GPT that grows induction heads
    12     interp         reading a trained model: patterns, ablation, patching, the OV circuit
    12     lens_port      course_lib's model inside TransformerLens 4
    13     flash          the online softmax and FlashAttention-2's tiled passes
    13     flex           PyTorch's FlexAttention: masks and score changes without a matrix
    13     paged          the KV cache in pages (PagedAttention): shared blocks, page-by-page attention
    14     launch         N processes in one gloo group, always ended
    14     parallel       gradient accumulation, data parallel, ZeRO-1, tensor parallel
    14     data_parallel  a bucketed DDP container built by hand (as CS336's), and its timeline
    14     sharding       ZeRO-1 around any optimizer, ZeRO's bytes per rank, collectives counted
    14     train_ddp      lesson 09's GPT under torchrun with DDP or FSDP2
    15     lora           LoRA by hand: LoRALinear, adapters on a frozen GPT, merge and unmerge (= PEFT)
    16     chat           a chat template: role and stop tokens, grown embeddings, generation that stops
    16     sft            supervised fine-tuning with the loss on the answer only (= TRL's)
    16     dpo            direct preference optimisation: sequence log-probabilities, the loss (= TRL's)
    01-12  viz            pictures: attention heatmaps, masks, curves
    02-12  bertviz_views  bertviz's interactive views, drawn offline

The data sets, ``data/`` (``python -m course_lib.data fetch`` fetches what lessons 09-10 read):

    06     data.copy_task        the copy task, a word-level vocabulary
    07     data.variable_length  copy or reverse with an end symbol
    08     data.translation      character vocabularies, padded pair batches, TSV files
    08     data.dates            the date-normalisation corpus
    09-15  data.shakespeare      Shakespeare's plays, split by play; the poems, split by poem
    10     data.gpt2_bpe         GPT-2's BPE files
    16     data.instructions     instructions about the plays that a program can judge
    09-10  data.files            where fetched data lives, the sha256 check

Studies of one lesson, ``studies/`` (runs stored in ``results/``, loaded by the lessons):

    06     studies.adam_betas       Adam's beta1, 0.7 against 0.9
    08     studies.dates_remedy     a date format never seen in training, and its remedy
    10     studies.tokens_vs_chars  characters against BPE tokens at equal compute
    11     studies.ablation         what each change of the Llama-style block buys
    11     studies.extrapolation    length generalisation of the position schemes
    15     studies.finetuning       fine-tuning on the poems: full, head, last block, BitFit, LoRA's ranks
    16     studies.instruct         SFT and DPO on instructions about the plays, judged by a program
    06-11  studies.stored           runs stored per float path

Exercises, by lesson (NN is the lesson's number):

    checks/lessonNN_<concept>.py   the checkers (``from course_lib.checks import check_...``)
    checks/common.py               what every checker shares
    solutions/lessonNN.py          the answers, behind ``show_solution``

The grader, ``grading/`` (``python -m course_lib.grading``; docs/instructors.md):

    grading.cli             the command: grade a class, write every file
    grading.lessons         which exercises a lesson has, read from its notebook
    grading.runner          one submission in its own limited (sandboxed) kernel
    grading.kernel_side     what runs inside that kernel, 1: the state a notebook may change, restored
    grading.kernel_recheck  what runs inside that kernel, 2: the re-check of every checker
    grading.integrity       course_lib as the run found it, or the run stops
    grading.limits          time and memory limits
    grading.points          points per exercise
    grading.report          grades.csv, the class report, each learner's feedback
    grading.csvfile         every CSV the grader writes, text cells neutralised for spreadsheets
    grading.roster          matching files to a roster
    grading.platforms       the platforms' options and files
    grading.canvas          Canvas's gradebook file
    grading.moodle          Moodle's grade import file
    grading.gradescope      a Gradescope autograder zip for one lesson
    grading.gradescope_run  what that autograder runs on Gradescope
    grading.shards          grading a class in shards on several machines
    grading.merge           merging the shards' rows
    grading.journal         a run killed midway: the journal it resumes from, nothing left running

Old names, kept importable until Part IV is complete (docs/developers.md): ``tasks``, ``stored``,
``adam_betas``, ``dates_remedy``, ``tokens_vs_chars``, ``ablation``, ``extrapolation``, ``grade``.
"""

from __future__ import annotations

import importlib
from typing import Any

# What ``from course_lib import X`` gives, and the module that defines it. A module is imported the
# first time one of its names is asked for, so the parts that need no torch (the grader, the data
# fetcher) start without importing it: about 1.5 s less for every grader process.
_EXPORTS = {
    "MultiHeadAttention": "attention",
    "scaled_dot_product_attention": "attention",
    "set_fused_attention": "attention",
    "CopyTask": "data.copy_task",
    "Vocab": "data.copy_task",
    "pad_sequences": "data.copy_task",
    "beam_search": "decoding",
    "greedy_decode": "decoding",
    "sample": "decoding",
    "LearnedPositionalEmbedding": "embeddings",
    "SinusoidalPositionalEncoding": "embeddings",
    "TokenEmbedding": "embeddings",
    "TransformerEmbedding": "embeddings",
    "sinusoidal_positional_encoding": "embeddings",
    "Decoder": "layers",
    "DecoderLayer": "layers",
    "Encoder": "layers",
    "EncoderLayer": "layers",
    "FeedForward": "layers",
    "causal_mask": "masks",
    "decoder_self_attention_mask": "masks",
    "padding_mask": "masks",
    "Transformer": "model",
    "TransformerClassifier": "model",
    "TransformerConfig": "model",
    "TransformerEncoderModel": "model",
    "count_parameters": "model",
    "init_xavier_": "model",
    "disable_shape_tracing": "tracing",
    "enable_shape_tracing": "tracing",
    "shape_tracing": "tracing",
    "LabelSmoothingLoss": "training",
    "exact_match": "training",
    "noam_lr": "training",
    "noam_scheduler": "training",
    "train": "training",
    "train_copy_task": "training",
}
__all__ = sorted(_EXPORTS)
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    """``course_lib.X``: a name of ``_EXPORTS`` from its module, or a submodule (``course_lib.training``)."""
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
        globals()[name] = value  # asked once
        return value
    if not name.startswith("_"):
        try:
            return importlib.import_module(f".{name}", __name__)
        except ModuleNotFoundError as err:
            if err.name != f"{__name__}.{name}":
                raise
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
