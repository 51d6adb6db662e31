"""Solutions to the exercises of lesson 10 (tokenization); see ``course_lib.solutions``."""

from __future__ import annotations

from course_lib.tokenization import pre_tokenize


# %% solution 10.token_counts
def predicted_token_counts():
    # GPT-2's tokens (measured with tiktoken on GPT-2's own files), spaces shown inside the quotes:
    return {
        "hello world": 2,   # 'hello' ' world': the space belongs to the word after it
        " Shakespeare": 1,  # ' Shakespeare': one token WITH its space ('Shakespeare' alone is 2)
        "HELLO WORLD": 4,   # 'HE' 'LL' 'O' ' WORLD': capitals are rarer, so fewer merges exist
        "123456789": 4,     # '123' '45' '67' '89': digit groups learned from frequencies, not 3s
        "strawberry": 3,    # 'st' 'raw' 'berry': not 'straw' + 'berry' (' strawberry' is 1 token)
        "   indented": 4,   # ' ' ' ' ' ind' 'ented': no token for a run of spaces; the last space
                            # of the run goes with the word
    }


# %% solution 10.merge
def merge(ids, pair, new_id):
    # Replace every occurrence of `pair` (two ids side by side) in `ids` by `new_id`.
    # The fix: after a match, skip BOTH ids of the pair, so that an id already merged is never
    # matched again: a run (a, a, a) with pair (a, a) becomes (new, a), left to right, as BPE does.
    out = []
    i = 0
    while i < len(ids):
        if i + 1 < len(ids) and (ids[i], ids[i + 1]) == pair:
            out.append(new_id)
            i += 2  # both ids of the pair are used up
        else:
            out.append(ids[i])
            i += 1
    return out


# %% solution 10.train_bpe
import heapq
from collections import Counter, defaultdict


def train_bpe(text, num_merges):
    # The course's rules, made fast. Each distinct chunk is a word of byte ids with its count in
    # the text. The pair counts are kept up to date instead of recounted: a merge changes only
    # the words that hold the merged pair, so only their pairs are taken out and put back. A heap
    # of (-count, pair) finds the most frequent pair (a tie: the smallest pair comes out first);
    # an entry whose count has changed since it was pushed is stale and skipped.
    chunk_counts = Counter(pre_tokenize(text))
    words = [list(chunk.encode("utf-8")) for chunk in chunk_counts]
    freq = list(chunk_counts.values())
    counts = defaultdict(int)  # pair -> how often it occurs in the text
    where = defaultdict(set)  # pair -> the words that hold it
    for w, word in enumerate(words):
        for pair in zip(word, word[1:]):  # every occurrence: the run "rrr" holds (r, r) twice
            counts[pair] += freq[w]
            where[pair].add(w)
    heap = [(-n, pair) for pair, n in counts.items()]
    heapq.heapify(heap)
    merges = {}
    for i in range(num_merges):
        while heap and counts.get(heap[0][1]) != -heap[0][0]:
            heapq.heappop(heap)  # stale
        if not heap or -heap[0][0] < 2:  # the course's rule: stop when no pair occurs twice
            break
        pair, new_id = heap[0][1], 256 + i
        merges[pair] = new_id
        changed = set()
        for w in where.pop(pair):
            old, new = words[w], merge(words[w], pair, new_id)  # your merge from exercise 1
            for p in zip(old, old[1:]):
                counts[p] -= freq[w]
                changed.add(p)
            for p in zip(new, new[1:]):
                counts[p] += freq[w]
                where[p].add(w)
                changed.add(p)
            words[w] = new
        for p in changed:
            if counts[p] > 0:
                heapq.heappush(heap, (-counts[p], p))
            else:
                del counts[p]
    return merges


# %% solution 10.bpe_encode
def bpe_encode(text, merges):
    # Byte-level BPE encoding: merge inside each chunk, the earliest-learned pair first.
    ids = []
    for chunk in pre_tokenize(text):
        chunk_ids = list(chunk.encode("utf-8"))
        while len(chunk_ids) >= 2:
            pairs = set(zip(chunk_ids, chunk_ids[1:]))
            # the pair with the lowest new id (learned first); pairs that are not merges last
            pair = min(pairs, key=lambda p: merges.get(p, float("inf")))
            if pair not in merges:
                break  # no adjacent pair is a merge: the chunk is done
            chunk_ids = merge(chunk_ids, pair, merges[pair])
        ids.extend(chunk_ids)
    return ids


# %% solution 10.wordpiece
def wordpiece(word, vocab):
    # Greedy longest-match-first (BERT's WordPiece) on one word; it never goes back.
    if len(word) > 100:  # BERT's max_input_chars_per_word
        return ["[UNK]"]
    pieces = []
    start = 0
    while start < len(word):
        end = len(word)
        piece = None
        while end > start:  # the longest substring first, then shorter ones
            candidate = word[start:end]
            if start > 0:
                candidate = "##" + candidate  # a continuation piece
            if candidate in vocab:
                piece = candidate
                break
            end -= 1
        if piece is None:  # nothing matches here: the whole word is unknown
            return ["[UNK]"]
        pieces.append(piece)
        start = end
    return pieces
