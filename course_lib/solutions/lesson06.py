"""Solutions to the exercises of lesson 06 (training on the copy task); see ``course_lib.solutions``."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


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

# %% solution 06.train_step
def train_step(model, batch, optimizer, loss_fn):
    """One training step on batch = (src, tgt_in, tgt_out); returns the loss (a float)."""
    src, tgt_in, tgt_out = batch
    optimizer.zero_grad()                       # the fix: backward() ADDS to .grad, so clear it
    logits = model(src, tgt_in)                 # (B, L, V): teacher forcing
    loss = loss_fn(logits, tgt_out)             # scalar, mean over non-pad labels
    loss.backward()                             # the gradients of this batch only
    optimizer.step()                            # update the weights
    return loss.item()
