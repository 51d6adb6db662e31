"""Solutions to the exercises of lesson 08 (translating dates). See ``course_lib.solutions``."""

import torch

from course_lib.data.copy_task import pad_sequences
from course_lib.masks import padding_mask

# %% solution 08.make_batch
def make_batch(pairs, src_vocab, tgt_vocab):
    """[(source, target), ...] -> (src, tgt_in, tgt_out), each (B, L) and right-padded."""
    src = [src_vocab.encode(source) for source, _ in pairs]          # characters only
    tgt = [tgt_vocab.encode(target) for _, target in pairs]
    tgt_in = [[tgt_vocab.sos_id, *t] for t in tgt]                   # <sos> + target
    tgt_out = [[*t, tgt_vocab.eos_id] for t in tgt]                  # target + <eos>: a step ahead
    pad = src_vocab.pad_id
    return pad_sequences(src, pad), pad_sequences(tgt_in, pad), pad_sequences(tgt_out, pad)

# %% solution 08.shapes
def predicted_shapes():
    # B = 4 pairs; the longest source "Entschuldigung" has 14 characters (no specials);
    # the longest target "three dogs" has 10, so L_t = 10 + 1 (<sos> in tgt_in, <eos> in tgt_out)
    return {
        "src": (4, 14),
        "src_mask": (4, 1, 14),        # one row per pair: it depends on the key only
        "tgt_in": (4, 11),
        "tgt_mask": (4, 11, 11),       # causal AND padding: a square per pair
        "label_mask": (4, 11),         # one flag per label of tgt_out
    }

# %% solution 08.translate
@torch.no_grad()
def my_translate(model, src, max_len, start_id, end_id):
    """src (B, L_s) padded source ids -> (B, <= max_len) generated ids (greedy)."""
    src_mask = padding_mask(src, model.config.pad_id)                # (B, 1, L_s)
    memory = model.encode(src, src_mask)                             # (B, L_s, d_model)
    # fixed: start from the start symbol; torch.zeros gave id 0, which is <pad>
    ys = torch.full((src.size(0), 1), start_id, dtype=torch.long)    # (B, 1)
    done = torch.zeros(src.size(0), dtype=torch.bool)                # (B,): rows that ended
    for _ in range(max_len):
        hidden = model.decode(ys, memory, src_mask)                  # (B, t, d_model)
        next_id = model.generator(hidden[:, -1]).argmax(dim=-1)      # (B,)
        ys = torch.cat([ys, next_id[:, None]], dim=1)                # (B, t + 1)
        done |= next_id == end_id
        if done.all():                                               # every row has ended
            break
    return ys[:, 1:]
