"""Solutions to the exercises of lesson 10 (tokenization); see ``course_lib.solutions``."""

from __future__ import annotations


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


# %% solution 10.wordpiece
def wordpiece(word, vocab):
    # Greedy longest-match-first (BERT's WordPiece) on one word.
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
