"""Solutions to the exercises of lesson 06 (training on the copy task); see ``course_lib.solutions``."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from course_lib.masks import padding_mask

# %% solution 06.shift
def make_decoder_io(tgt: torch.Tensor, sos_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """tgt (B, L) -> (tgt_in (B, L), tgt_out (B, L)) for teacher forcing."""
    sos = torch.full((tgt.size(0), 1), sos_id, dtype=tgt.dtype)  # (B, 1)
    tgt_in = torch.cat([sos, tgt[:, :-1]], dim=1)                # the ONE shift: (B, L)
    return tgt_in, tgt                                           # the labels are the target itself

# %% solution 06.label_smoothing
def label_smoothing_loss(logits: torch.Tensor, labels: torch.Tensor, pad_id: int,
                         smoothing: float) -> torch.Tensor:
    """logits (..., V), labels (...) -> scalar: smoothed cross-entropy, mean over non-pad labels."""
    V = logits.size(-1)
    logp = F.log_softmax(logits.reshape(-1, V), dim=-1)        # (N, V)
    labels = labels.reshape(-1)                                # (N,)
    target = torch.full_like(logp, smoothing / (V - 2))        # eps over the V - 2 "other" classes
    target.scatter_(1, labels.unsqueeze(1), 1.0 - smoothing)   # 1 - eps on the label
    target[:, pad_id] = 0.0                                    # never predict <pad>
    target[labels == pad_id] = 0.0                             # pad labels are ignored
    return -(target * logp).sum() / (labels != pad_id).sum()

# %% solution 06.smoothing_floor
def predicted_floor() -> float:
    """The lowest loss LabelSmoothingLoss(V=11, pad_id=0, smoothing=0.1) allows."""
    # The loss -sum q log p is smallest for p = q, where it is the entropy of q:
    # 0.9 on the label, 0.1 / 9 on each of the 9 other non-pad classes, 0 on <pad>.
    import math

    eps, other_classes = 0.1, 9
    share = eps / other_classes
    return -((1 - eps) * math.log(1 - eps) + other_classes * share * math.log(share))

# %% solution 06.greedy_src_mask
@torch.no_grad()
def my_greedy_decode(model, src: torch.Tensor, max_len: int, start_id: int) -> torch.Tensor:
    """src (B, L_s) -> (B, max_len) generated ids, without the start symbol."""
    src_mask = padding_mask(src, model.config.pad_id)                         # (B, 1, L_s)
    memory = model.encode(src, src_mask)                                      # (B, L_s, d_model)
    ys = torch.full((src.size(0), 1), start_id, dtype=torch.long)             # (B, 1)
    for _ in range(max_len):
        hidden = model.decode(ys, memory, src_mask)     # fixed: cross-attention hides the padding
        next_id = model.generator(hidden[:, -1]).argmax(dim=-1)               # (B,)
        ys = torch.cat([ys, next_id.unsqueeze(1)], dim=1)                     # (B, t + 1)
    return ys[:, 1:]
