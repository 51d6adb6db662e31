"""Benchmark: lesson 10's tokenizers, training and encoding, side by side in one run.

    python benchmarks/tokenization.py                (or: make benchmark)
    python benchmarks/tokenization.py --merges 100   (a quick check that it runs)

**Training.** Byte-level BPE on Shakespeare's 33 training plays after GPT-2's regex
pre-tokenisation (``word_counts``: distinct chunks with their counts, done once, timed apart).
Both totals include that shared pre-tokenisation (what ``BPETokenizer.train`` costs).
The incremental trainer (``method="incremental"``: update only the counts that a merge changes)
learns ``--merges`` merges (default 2,000). The naive trainer (recount every pair after each
merge, as minbpe does) is timed on its first ``--naive-merges`` (default 200) merges only, and
must give the same merges as the incremental one. Its cost per merge falls slowly (words get
shorter as merges join bytes), so its total is extrapolated at the rate of its *second* half
(merges 101-200 by default), the later and usually the lower of the two rates measured; the
later merges would be cheaper still, so the estimate is an upper bound on the naive time. The line says so. (Measured
once: the pair positions of the distinct chunks fall to 62% of the start by merge 200 and to 43%
by merge 2,000; if the naive cost per merge followed them, the estimate would be up to about a
third too high: the speed-up's target still holds by a wide margin.)
Target: incremental >= 20x faster than naive and <= 30 s.

**Encoding.** The whole corpus (training and validation plays, 4.85 MB) with the course's
``GPT2Tokenizer`` (pure Python, a cache of pre-tokenised chunks, starting empty), tiktoken and
Hugging Face's GPT-2 tokenizer (Rust), all built from the same local files: the course's and
tiktoken as one string (the last line), then all three on the corpus cut into lines that keep
their newlines (Hugging Face is several times slower on one 4.85 MB string; tiktoken is slower
by line, so the last line uses the one-string numbers). Each way, the encoders must give the
same ids. MB/s = UTF-8 megabytes (10^6 bytes) per second, best of ``--repeats`` runs (ours
with a fresh, empty cache each time). Target: within 10x of tiktoken. The last lines, e.g.

    bpe train: 2000 merges in 12.3 s (naive 410.0 s, extrapolated from 200 merges, 33x)
    gpt2 encode: 2.1 MB/s (tiktoken 9.8 MB/s, 4.7x)
"""

from __future__ import annotations

import argparse
import os
import platform
import time

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # one thread for Hugging Face, as ours

from course_lib.data.shakespeare import ShakespeareCorpus  # noqa: E402
from course_lib.tokenization import (  # noqa: E402
    GPT2_SPLIT_PATTERN,
    GPT2Tokenizer,
    _train_incremental,
    _train_naive,
    gpt2_files,
    word_counts,
)


def time_training(text: str, merges: int, naive_merges: int) -> dict:
    """Pre-tokenise once, train incrementally for ``merges`` and naively for ``naive_merges``."""
    start = time.perf_counter()
    words = word_counts(text, GPT2_SPLIT_PATTERN)
    pre_seconds = time.perf_counter() - start
    start = time.perf_counter()
    incremental = _train_incremental(words, merges)
    incremental_seconds = time.perf_counter() - start
    naive_merges = min(naive_merges, merges)
    stamps: list[float] = []
    start = time.perf_counter()
    naive = _train_naive(words, naive_merges, on_merge=lambda i: stamps.append(time.perf_counter()))
    if list(naive.items()) != list(incremental.items())[: len(naive)]:
        raise AssertionError("the naive and the incremental trainers learned different merges")
    half = len(stamps) // 2
    first_half, second_half = stamps[half - 1] - start, stamps[-1] - stamps[half - 1]
    rate = second_half / (len(stamps) - half)  # seconds per merge, merges half+1 .. end
    naive_estimate = stamps[-1] - start + rate * (len(incremental) - len(stamps))
    return dict(words=len(words), pre_seconds=pre_seconds, merges=len(incremental),
                incremental_seconds=incremental_seconds, naive_done=len(stamps), half=half,
                naive_first_half=first_half, naive_second_half=second_half,
                naive_estimate=naive_estimate)


def lines_with_ends(text: str) -> list[str]:
    """``text`` cut after each newline (the newlines kept): the pieces join back to ``text``."""
    lines = [line + "\n" for line in text.split("\n")]
    lines[-1] = lines[-1][:-1]
    return [line for line in lines if line]


def time_encoding(text: str, repeats: int) -> dict:
    """MB/s of the course's GPT-2 encoder, tiktoken and Hugging Face on ``text``: as one string
    (the course and tiktoken) and cut into lines with their newlines (all three: Hugging Face is
    several times slower on one 4.85 MB string). Each way, the encoders must give the same ids."""
    import tiktoken
    from tiktoken.load import data_gym_to_mergeable_bpe_ranks
    from transformers import GPT2TokenizerFast

    encoder_json, vocab_bpe = gpt2_files()
    enc = tiktoken.Encoding(
        name="gpt2_local", pat_str=GPT2_SPLIT_PATTERN,
        mergeable_ranks=data_gym_to_mergeable_bpe_ranks(
            vocab_bpe_file=str(vocab_bpe), encoder_json_file=str(encoder_json)),
        special_tokens={"<|endoftext|>": 50256})
    hf = GPT2TokenizerFast(vocab=str(encoder_json), merges=str(vocab_bpe)).backend_tokenizer
    lines = lines_with_ends(text)
    assert "".join(lines) == text
    megabytes = len(text.encode("utf-8")) / 1e6

    def fresh_course():  # a new tokenizer each run: its cache of chunks starts empty
        return GPT2Tokenizer.from_files().encode

    def one_string(encode):
        return encode(text)

    def by_line(encode):
        return [encode(line) for line in lines]

    def hf_by_line(encode_batch):  # TOKENIZERS_PARALLELISM=false: one thread
        return [e.ids for e in encode_batch(lines, add_special_tokens=False)]

    runs = {  # name -> (make the encoder, off the clock; encode the corpus with it, timed)
        "course": (fresh_course, one_string),
        "tiktoken": (lambda: enc.encode_ordinary, one_string),
        "course, lines": (fresh_course, by_line),
        "tiktoken, lines": (lambda: enc.encode_ordinary, by_line),
        "hugging face, lines": (lambda: hf.encode_batch, hf_by_line),
    }
    best, ids = {}, {}
    for name, (make, encode_corpus) in runs.items():
        for _ in range(repeats):
            encoder = make()
            start = time.perf_counter()
            ids[name] = encode_corpus(encoder)
            seconds = time.perf_counter() - start
            best[name] = min(best.get(name, seconds), seconds)
    if ids["course"] != ids["tiktoken"]:
        raise AssertionError("the course's GPT-2 encoder and tiktoken differ on the corpus")
    if not ids["course, lines"] == ids["tiktoken, lines"] == ids["hugging face, lines"]:
        raise AssertionError("the three GPT-2 encoders gave different ids on the corpus lines")
    return dict(megabytes=megabytes, lines=len(lines), tokens=len(ids["course"]),
                mb_per_s={name: megabytes / s for name, s in best.items()})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--merges", type=int, default=2000)
    parser.add_argument("--naive-merges", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if args.merges < 2 or args.naive_merges < 2 or args.repeats < 1:
        parser.error("--merges and --naive-merges must be >= 2, --repeats >= 1")
    print(f"{os.cpu_count()} CPUs, {platform.processor() or platform.machine()}, "
          f"Python {platform.python_version()}")
    corpus = ShakespeareCorpus()
    print(corpus)

    t = time_training(corpus.train_text, args.merges, args.naive_merges)
    # both totals include the shared pre-tokenisation: what BPETokenizer.train costs
    incremental_total = t["pre_seconds"] + t["incremental_seconds"]
    naive_total = t["pre_seconds"] + t["naive_estimate"]
    speedup = naive_total / incremental_total
    print(f"pre-tokenisation: {t['words']:,} distinct chunks in {t['pre_seconds']:.1f} s (shared)")
    print(f"naive: merges 1-{t['half']} in {t['naive_first_half']:.1f} s, merges "
          f"{t['half'] + 1}-{t['naive_done']} in {t['naive_second_half']:.1f} s; the same merges "
          "as the incremental trainer")
    extrapolated = (f"extrapolated from {t['naive_done']} merges at the rate of merges "
                    f"{t['half'] + 1}-{t['naive_done']}" if t["naive_done"] < t["merges"]
                    else "measured")
    print(f"(target: incremental >= 20x faster and <= 30 s: "
          f"{'met' if speedup >= 20 and incremental_total <= 30 else 'NOT met'})")

    e = time_encoding(corpus.train_text + "\n" + corpus.val_text, args.repeats)
    rates = e["mb_per_s"]
    print(f"corpus: {e['megabytes']:.2f} MB, {e['tokens']:,} GPT-2 tokens; best of {args.repeats}, "
          "the same ids from every encoder:")
    for name, rate in rates.items():
        print(f"  {name:20s} {rate:6.2f} MB/s" + ("" if "lines" in name else "   (one string)"))
    ratio = rates["tiktoken"] / rates["course"]
    print(f"(target: within 10x of tiktoken: {'met' if ratio <= 10 else 'NOT met'})")
    print(f"bpe train: {t['merges']} merges in {incremental_total:.1f} s "
          f"(naive {naive_total:.1f} s, {extrapolated}, {speedup:.0f}x)")
    print(f"gpt2 encode: {rates['course']:.1f} MB/s (tiktoken {rates['tiktoken']:.1f} MB/s, "
          f"{ratio:.1f}x)")


if __name__ == "__main__":
    main()
