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
def train_bpe(text, num_merges):
    # BPE's training loop on the chunks of `text`, each chunk a list of byte ids.
    words = [list(chunk.encode("utf-8")) for chunk in pre_tokenize(text)]
    merges = {}
    for i in range(num_merges):
        counts = {}
        for word in words:  # every adjacent pair inside each chunk, every occurrence
            for pair in zip(word, word[1:]):
                counts[pair] = counts.get(pair, 0) + 1
        if not counts:
            break
        # the most frequent pair; a tie goes to the smallest pair (a, b)
        pair = max(counts, key=lambda p: (counts[p], -p[0], -p[1]))
        if counts[pair] < 2:  # the course's rule: stop when no pair occurs twice
            break
        new_id = 256 + i
        merges[pair] = new_id
        words = [merge(word, pair, new_id) for word in words]  # your merge from exercise 1
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
