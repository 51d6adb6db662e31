"""Lesson-10 ★★★ checker, BPE's training loop (course_lib/checks/lesson10_train_bpe.py): right answers in
several styles pass (in time), each mistake is named."""

from __future__ import annotations


import numpy as np
import pytest
from _helpers import as_library, passes, solution_namespace

from course_lib.checks import (
    CheckFailure, check_train_bpe, lesson10_tokenization as tokens10, lesson10_train_bpe as train10,
)


# ----------------------------------------------------------------------------------------------
# build (★★★): the BPE training loop
# ----------------------------------------------------------------------------------------------


def _train_fast_with_max(text, num_merges):
    """Incremental counts with an index pair -> words; max() over all counts picks each merge."""
    import collections

    from course_lib.tokenization import merge, pre_tokenize

    words = collections.Counter(tuple(c.encode()) for c in pre_tokenize(text))
    lists, freq = [list(w) for w in words], list(words.values())
    counts, where = collections.defaultdict(int), collections.defaultdict(set)
    for k, w in enumerate(lists):
        for p in zip(w, w[1:]):
            counts[p] += freq[k]
            where[p].add(k)
    merges = {}
    for i in range(num_merges):
        if not counts:
            break
        pair = max(counts, key=lambda p: (counts[p], -p[0], -p[1]))
        if counts[pair] < 2:
            break
        merges[pair] = 256 + i
        for k in list(where.pop(pair)):
            old = lists[k]
            new = merge(old, pair, 256 + i)
            for p in zip(old, old[1:]):
                counts[p] -= freq[k]
                if counts[p] == 0:
                    del counts[p]
            for p in zip(new, new[1:]):
                counts[p] += freq[k]
                where[p].add(k)
            lists[k] = new
    return merges


def _train_fast_every_chunk(text, num_merges):
    """Incremental, but every chunk of the text kept (no distinct chunks with counts), positions
    of each pair in a dict of sets; ties by sorting the best candidates (the slowest style that
    passes: about 6x course_lib's CPU time)."""
    from course_lib.tokenization import pre_tokenize

    words = [list(c.encode("utf-8")) for c in pre_tokenize(text)]
    counts, where = {}, {}
    for k, w in enumerate(words):
        for p in zip(w, w[1:]):
            counts[p] = counts.get(p, 0) + 1
            where.setdefault(p, set()).add(k)
    merges = {}
    while len(merges) < num_merges and counts:
        top = max(counts.values())
        if top < 2:
            break
        pair = sorted(p for p, n in counts.items() if n == top)[0]
        new_id = 256 + len(merges)
        merges[pair] = new_id
        for k in where.pop(pair):
            w, out, j = words[k], [], 0
            while j < len(w):
                if j + 1 < len(w) and (w[j], w[j + 1]) == pair:
                    out.append(new_id)
                    j += 2
                else:
                    out.append(w[j])
                    j += 1
            for p in zip(w, w[1:]):
                counts[p] -= 1
                if not counts[p]:
                    del counts[p]
            for p in zip(out, out[1:]):
                counts[p] = counts.get(p, 0) + 1
                where.setdefault(p, set()).add(k)
            words[k] = out
        counts.pop(pair, None)
    return merges


def _train_with_pair_counts(text, num_merges):
    """pair_counts and word_counts, which the lesson shows, for the first counts; then a lazy heap
    of (-count, pair) updated as words change (numpy ints as new ids)."""
    import heapq

    from course_lib.tokenization import pair_counts, word_counts

    words = {w: n for w, n in word_counts(text).items()}
    counts = pair_counts(words)
    holders: dict = {}
    for w in words:
        for p in zip(w, w[1:]):
            holders.setdefault(p, set()).add(w)
    heap = [(-n, p) for p, n in counts.items()]
    heapq.heapify(heap)
    merges = {}
    for i in range(num_merges):
        while heap and counts.get(heap[0][1], 0) != -heap[0][0]:
            heapq.heappop(heap)
        if not heap or -heap[0][0] < 2:
            break
        pair = heapq.heappop(heap)[1]
        merges[pair] = np.int64(256 + i)
        touched = set()
        for w in holders.pop(pair, ()):
            if w not in words:
                continue
            n = words.pop(w)
            out, j = [], 0
            while j < len(w):
                if w[j:j + 2] == pair:
                    out.append(256 + i)
                    j += 2
                else:
                    out.append(w[j])
                    j += 1
            new = tuple(out)
            words[new] = words.get(new, 0) + n
            for p in zip(w, w[1:]):
                counts[p] -= n
                touched.add(p)
            for p in zip(new, new[1:]):
                counts[p] += n
                holders.setdefault(p, set()).add(new)
                touched.add(p)
        for p in touched:
            if counts[p] > 0:
                heapq.heappush(heap, (-counts[p], p))
            else:
                del counts[p]
    return merges


def _train_naive(text, num_merges):
    """Correct, but recounts every pair of the distinct chunks after each merge (too slow)."""
    import collections

    from course_lib.tokenization import merge, pre_tokenize

    words = collections.Counter(tuple(c.encode()) for c in pre_tokenize(text))
    merges = {}
    for i in range(num_merges):
        counts = collections.Counter()
        for w, n in words.items():
            for p in zip(w, w[1:]):
                counts[p] += n
        best = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
        if not best or best[0][1] < 2:
            break
        pair = best[0][0]
        merges[pair] = 256 + i
        new = collections.Counter()
        for w, n in words.items():
            new[tuple(merge(list(w), pair, 256 + i))] += n
        words = new
    return merges


def _train_naive_lesson(text, num_merges):
    """The lesson's loop as first written: every chunk, pair_counts recounting after each merge."""
    from course_lib.tokenization import merge, pair_counts, pre_tokenize

    words = [list(c.encode("utf-8")) for c in pre_tokenize(text)]
    merges = {}
    while len(merges) < num_merges:
        counts = pair_counts(words)
        top = max(counts.values(), default=0)
        if top < 2:
            return merges
        pair = min(p for p, n in counts.items() if n == top)
        merges[pair] = 256 + len(merges)
        words = [merge(w, pair, merges[pair]) for w in words]
    return merges


@pytest.fixture
def tenth_of_the_text(monkeypatch):
    """The speed test on the first 100,000 characters: a tenth of the test's cost, with the same
    separation (1,000 merges, the collector paused: the recount of the distinct chunks 63-74x
    course_lib's CPU time, quiet and 3 side by side; the budget about 3 s)."""
    text = train10._speed_plays()[:100_000]
    monkeypatch.setattr(train10, "_speed_plays", lambda: text)


def test_train_bpe_solution_passes(capsys):
    """The solution, on the checker's real megabyte and 1,000 merges, within its CPU budget."""
    assert passes(check_train_bpe, solution_namespace("10.train_bpe")["train_bpe"])
    out = capsys.readouterr().out
    assert "check_train_bpe: all 8 texts" in out and "1,000 merges on a megabyte" in out


def test_train_bpe_speed_text_is_a_megabyte_of_the_training_plays():
    from course_lib.data.shakespeare import ShakespeareCorpus

    text = train10._speed_plays()
    assert len(text) == train10._TRAIN_SPEED_CHARS == 1_000_000
    assert ShakespeareCorpus().train_text.startswith(text)


def test_train_bpe_reference_is_course_libs_trainer():
    import warnings

    from course_lib.tokenization import BPETokenizer

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _, text, n in train10._TRAIN_CASES:
            for method in ("naive", "incremental"):
                assert train10.reference_train_bpe(text, n) == BPETokenizer.train(
                    text, 256 + n, method=method).merges


@pytest.mark.parametrize("fn", [_train_fast_with_max, _train_fast_every_chunk,
                                _train_with_pair_counts], ids=lambda f: f.__name__)
def test_train_bpe_other_fast_styles_pass(fn, tenth_of_the_text):
    assert passes(check_train_bpe, fn), fn.__name__


@pytest.mark.parametrize("fn", [_train_naive, _train_naive_lesson], ids=lambda f: f.__name__)
def test_train_bpe_recount_after_every_merge_is_too_slow(fn, tenth_of_the_text):
    """Right on the small texts, stopped on the plays after 20x course_lib's CPU time, and told
    why; pair_counts, which the lesson shows, is not refused as course_lib's."""
    with pytest.raises(CheckFailure, match="Too slow") as info:
        check_train_bpe(fn)
    message = str(info.value)
    assert "20 times what course_lib's trainer took" in message
    assert "counting every pair of every chunk again after each merge" in message


def test_train_bpe_speed_timings_pause_the_garbage_collector(tenth_of_the_text, monkeypatch):
    """A full collection in a process with many objects costs more than course_lib's run on the
    tests' text: both timings run with the collector paused, and it is on again afterwards."""
    import gc

    from course_lib.tokenization import BPETokenizer

    solution = solution_namespace("10.train_bpe")["train_bpe"]
    train = BPETokenizer.train
    seen = []

    def course_train(text, vocab_size, *args, **kwargs):
        if len(text) == 100_000:
            seen.append(("course_lib", gc.isenabled()))
        return train(text, vocab_size, *args, **kwargs)

    def train_bpe(text, num_merges):
        if len(text) == 100_000:
            seen.append(("learner", gc.isenabled()))
        return solution(text, num_merges)

    monkeypatch.setattr(BPETokenizer, "train", course_train)
    assert gc.isenabled()
    assert passes(check_train_bpe, train_bpe)
    assert gc.isenabled()
    assert seen and ("learner", False) in seen and ("course_lib", False) in seen
    assert all(not enabled for _, enabled in seen), seen


def test_train_bpe_cpu_budget_is_cpu_time_not_wall_time(tenth_of_the_text, monkeypatch):
    """Sleeping (another program's turn on a busy machine) does not count against the budget."""
    import time

    solution = solution_namespace("10.train_bpe")["train_bpe"]

    def train_bpe(text, num_merges):
        if len(text) > 100_000:
            time.sleep(3)
        return solution(text, num_merges)

    monkeypatch.setattr(train10, "_TRAIN_SPEED_FLOOR", 0.5)
    monkeypatch.setattr(train10, "_TRAIN_SPEED_RATIO", 3)
    assert passes(check_train_bpe, train_bpe)


def _train_stale_heap(text, num_merges):
    """A heap of (-count, pair) whose entries are never checked against the current counts: an
    entry pushed before a merge lowered that pair's count is taken with its old count."""
    import collections
    import heapq

    from course_lib.tokenization import merge, pre_tokenize

    words = collections.Counter(tuple(c.encode()) for c in pre_tokenize(text))
    lists, freq = [list(w) for w in words], list(words.values())
    counts, where = collections.defaultdict(int), collections.defaultdict(set)
    for k, w in enumerate(lists):
        for p in zip(w, w[1:]):
            counts[p] += freq[k]
            where[p].add(k)
    heap = [(-n, p) for p, n in counts.items()]
    heapq.heapify(heap)
    merges = {}
    for i in range(num_merges):
        while heap and heap[0][1] in merges:
            heapq.heappop(heap)
        if not heap or -heap[0][0] < 2:
            break
        pair = heapq.heappop(heap)[1]
        merges[pair] = 256 + i
        touched = set()
        for k in where.pop(pair, ()):
            old, new = lists[k], merge(lists[k], pair, 256 + i)
            for p in zip(old, old[1:]):
                counts[p] -= freq[k]
                touched.add(p)
            for p in zip(new, new[1:]):
                counts[p] += freq[k]
                where[p].add(k)
                touched.add(p)
            lists[k] = new
        for p in touched:
            if counts[p] > 0:
                heapq.heappush(heap, (-counts[p], p))
    return merges


def test_train_bpe_merging_only_the_first_occurrence_is_named():
    """A merge of its own that replaces the first occurrence only: the pair comes back, is
    merged again, and the dict keeps its last new id (the ids skip)."""
    from course_lib.tokenization import pre_tokenize

    def train_bpe(text, num_merges):
        def merge_first(w, pair, new):
            for j in range(len(w) - 1):
                if (w[j], w[j + 1]) == pair:
                    return w[:j] + [new] + w[j + 2:]
            return w

        words = [list(c.encode()) for c in pre_tokenize(text)]
        merges = {}
        for i in range(num_merges):
            counts = {}
            for w in words:
                for p in zip(w, w[1:]):
                    counts[p] = counts.get(p, 0) + 1
            best = max(counts.values(), default=0)
            if best < 2:
                break
            pair = min(p for p in counts if counts[p] == best)
            merges[pair] = 256 + i
            words = [merge_first(w, pair, 256 + i) for w in words]
        return merges

    with pytest.raises(CheckFailure, match="the new ids skip \\[256\\]") as info:
        check_train_bpe(train_bpe)
    assert "each merge replaces every occurrence of the pair, in every chunk" in str(info.value)


def test_train_bpe_stale_counts_are_named_with_the_true_counts():
    with pytest.raises(CheckFailure, match="At merge 2 \\(new id 258\\)") as info:
        check_train_bpe(_train_stale_heap)
    message = str(info.value)
    assert "you merge (116, 104) (b'th'), which occurs 0 times there" in message
    assert "but (116, 257) (b'the'), which occurs 3 times there" in message
    assert "have drifted from the true counts" in message


def test_train_bpe_stopping_early_is_named_with_the_count():
    def train_bpe(text, num_merges):  # stops 10 merges early on the longer text
        merges = solution_namespace("10.train_bpe")["train_bpe"](text, num_merges)
        return dict(list(merges.items())[:50]) if num_merges == 60 else merges

    with pytest.raises(CheckFailure, match="You stop after 50 merges, but then .*, which occurs "
                                           "[2-9] times there: training goes on"):
        check_train_bpe(train_bpe)


def test_train_bpe_one_merge_too_many_is_named():
    """The stop checked after the merge is recorded: one merge of a pair seen once."""
    from course_lib.tokenization import merge, pre_tokenize

    def train_bpe(text, num_merges):
        words = [list(c.encode()) for c in pre_tokenize(text)]
        merges = {}
        for i in range(num_merges):
            counts = {}
            for w in words:
                for p in zip(w, w[1:]):
                    counts[p] = counts.get(p, 0) + 1
            if not counts:
                break
            pair = max(counts, key=lambda p: (counts[p], -p[0], -p[1]))
            merges[pair] = 256 + i
            if counts[pair] < 2:
                break
            words = [merge(w, pair, 256 + i) for w in words]
        return merges

    with pytest.raises(CheckFailure, match="You go on after 2 merges, but then the most frequent "
                                           "pair is \\(32, 256\\) \\(b' ab'\\), which "
                                           "occurs 1 times there"):
        check_train_bpe(train_bpe)


def test_train_bpe_wrong_merges_on_the_plays_only(tenth_of_the_text):
    """Right on the small texts, one merge changed on the plays: where, and what to look at."""
    solution = solution_namespace("10.train_bpe")["train_bpe"]

    def train_bpe(text, num_merges):
        merges = solution(text, num_merges)
        if len(text) < 50_000:
            return merges
        items = list(merges.items())
        (a, b), new_id = items[500]
        return dict(items[:500] + [((b, a), new_id)] + items[501:])

    with pytest.raises(CheckFailure, match="Wrong merges .*first 100,000 characters.*merge 500 "
                                           "\\(new id 756\\)") as info:
        check_train_bpe(train_bpe)
    assert "The counts your loop keeps have drifted from the true counts" in str(info.value)


def _train(**knobs):
    def train_bpe(text, num_merges):
        return train10.reference_train_bpe(text, num_merges, **knobs)

    return train_bpe


@pytest.mark.parametrize("knobs, reason", train10._TRAIN_MISTAKES,
                         ids=[str(k) for k, _ in train10._TRAIN_MISTAKES])
def test_train_bpe_every_mistake_is_named(knobs, reason):
    with pytest.raises(CheckFailure, match="Likely mistake") as info:
        check_train_bpe(_train(**knobs))
    assert reason in str(info.value)


def _chunked(chunker, once_per_chunk=False):
    """A learner's (slow, small-text) trainer with its own chunks and counting."""
    from course_lib.tokenization import merge

    def train_bpe(text, num_merges):
        words = [list(c.encode()) for c in chunker(text)]
        merges = {}
        for i in range(num_merges):
            counts = {}
            for w in words:
                for p in (set(zip(w, w[1:])) if once_per_chunk else zip(w, w[1:])):
                    counts[p] = counts.get(p, 0) + 1
            if not counts:
                break
            pair = max(counts, key=lambda p: (counts[p], -p[0], -p[1]))
            if counts[pair] < 2:
                break
            merges[pair] = 256 + i
            words = [merge(w, pair, 256 + i) for w in words]
        return merges

    return train_bpe


@pytest.mark.parametrize(
    "chunker, once, words",
    [
        (lambda text: tokens10.gpt2_chunks(text), True, "a pair is counted once per chunk"),
        (str.split, False, "yours leave the spaces out of the words"),
        (lambda text: __import__("re").findall(r"\w+|[^\w\s]+", text), False,
         "yours leave the spaces out of the words"),
        (lambda text: __import__("re").findall(r"[A-Za-z]+|\S", text), False,
         "yours leave the spaces out of the words"),
        (lambda text: __import__("re").findall(r" ?\w+| ?[^\w\s]+|\s+", text), False,
         "your home-made regex cuts some chunks elsewhere"),
        (lambda text: __import__("re").findall(r"\s?\w+|\s?[^\w\s]+", text), False,
         "your chunks are not pre_tokenize's: your token b'2n' is in none of them"),
        (lambda text: __import__("re").findall(r" ?[a-zA-Z']+|.", text), False,
         "your home-made regex cuts some chunks elsewhere"),
    ],
)
def test_train_bpe_chunks_and_counting_mistakes_are_named(chunker, once, words):
    with pytest.raises(CheckFailure, match="Likely mistake") as info:
        check_train_bpe(_chunked(chunker, once))
    assert __import__("re").search(words, str(info.value)), str(info.value)
    assert "training stops too early" not in str(info.value)
    assert "each distinct chunk is counted once" not in str(info.value)


@pytest.mark.parametrize(
    "fn, words",
    [
        (lambda text, n: None, "returns None"),
        (lambda text, n: list(train10.reference_train_bpe(text, n)), "return a dict"),
        (lambda text, n: {str(p): i for p, i in train10.reference_train_bpe(text, n).items()},
         "a pair of ids"),
        (lambda text, n: {tuple(t + 2 * (t >= 256) for t in p): i + 2
                          for p, i in train10.reference_train_bpe(text, n).items()},
         "Wrong new ids"),
        (lambda text, n: {(0, 0): 256, **{p: i for p, i in train10.reference_train_bpe(
            text, n).items() if i > 256}}, "At merge 0 \\(new id 256\\).*you merge \\(0, 0\\)"),
        (lambda text, n: {}[text], "Your code raised KeyError"),
    ],
)
def test_train_bpe_bad_answers(fn, words):
    with pytest.raises(CheckFailure, match=words):
        check_train_bpe(fn)


def test_train_bpe_refuses_course_libs_trainer_kindly():
    import warnings

    from course_lib import tokenization
    from course_lib.tokenization import BPETokenizer, word_counts

    def with_the_trainer(text, num_merges):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return BPETokenizer.train(text, 256 + num_merges).merges

    with pytest.raises(CheckFailure, match="calls `course_lib`'s `BPETokenizer.train`.*the very "
                                           "thing this exercise builds"):
        check_train_bpe(with_the_trainer)

    def with_the_inner_trainer(text, num_merges):
        return tokenization._train_incremental(word_counts(text), num_merges)  # course_lib's own

    with pytest.raises(CheckFailure, match="`_train_incremental`"):
        check_train_bpe(with_the_inner_trainer)
    with pytest.raises(CheckFailure, match="course_lib's own code"):
        check_train_bpe(as_library(with_the_trainer, "course_lib.tokenization"))


def test_train_bpe_endless_loop_is_stopped(monkeypatch):
    monkeypatch.setattr(train10, "_TRAIN_SECONDS", 0.5)

    def train_bpe(text, num_merges):
        while True:
            pass

    with pytest.raises(CheckFailure, match="did not finish within 0.5 s"):
        check_train_bpe(train_bpe)


def test_train_bpe_without_the_plays_says_what_to_run(monkeypatch, tmp_path):
    monkeypatch.setenv("COURSE_DATA_DIR", str(tmp_path))
    monkeypatch.setattr(train10, "_speed_plays", train10._speed_plays.__wrapped__)
    with pytest.raises(CheckFailure, match="python -m course_lib.data fetch"):
        check_train_bpe(solution_namespace("10.train_bpe")["train_bpe"])


def test_train_bpe_stub(capsys):
    def train_bpe(text, num_merges):
        raise NotImplementedError

    check_train_bpe(train_bpe)
    assert "not implemented yet" in capsys.readouterr().out
