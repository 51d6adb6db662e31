"""Reading a trained attention-only GPT (lesson 12): patterns, head scores, ablation, patching,
K-composition (path ablation), direct logit attribution and the full OV circuit.

A head's output is the slice ``[h * head_dim, (h + 1) * head_dim)`` of what goes INTO the layer's
``out_proj`` (``merge_heads`` of the heads, ``(B, T, d_model)``); ``out_proj`` then adds every head's
``z_h @ W_O[h]`` to the residual stream. So one forward pre-hook on ``out_proj`` can read, zero,
average or replace any head: TransformerLens calls that tensor ``hook_z`` (shape ``(B, T, h, d_head)``).

Scores, for a pattern ``(B, h, T, T)``:

- previous-token: mean attention from position ``i`` to ``i - 1``;
- duplicate-token (the head type of the IOI paper, Wang et al. 2022): mean attention from a token to
  the earlier positions holding the same token, over the positions that have one;
- induction (Olsson et al. 2022), on ``[r, r]`` with ``n = len(r)``: mean attention from ``i`` in the
  second copy to ``i - n + 1``, the position just after the earlier occurrence of token ``i``.

TransformerLens's ``head_detector.detect_head`` defines them otherwise (the attention on the detected
positions over the attention of all ``T`` queries, crediting every earlier occurrence): on ``[r, r]``
its induction score is about half of this one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F

from .attention import MultiHeadAttention
from .gpt import GPT

__all__ = ["attention_patterns", "previous_token_score", "duplicate_token_score", "induction_score",
           "head_scores", "loss_per_position", "head_outputs", "ablation_hook", "hooked",
           "ablated_loss", "ablation_table", "patching_hook", "patching_table", "key_path_ablation",
           "direct_logit_attribution", "full_ov_circuit", "copying_scores"]


def _attentions(model: GPT) -> list[MultiHeadAttention]:
    return [layer.self_attn for layer in model.blocks.layers]


def _check_index(value: object, name: str, count: int, where: str) -> int:
    """``value`` as an int in ``0 .. count - 1``, or a ValueError naming ``name`` and the range."""
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_floating_point():
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < count:
        raise ValueError(f"{where}: {name} must be an int in 0 .. {count - 1}, got {value!r}")
    return value


def _check_model(model: object, where: str) -> GPT:
    if not isinstance(model, GPT):
        raise TypeError(f"{where}: expected a course_lib GPT (the model itself, e.g. what "
                        f"induction.train_induction returns), got {type(model).__name__}")
    return model


def _check_ids(ids: object, where: str, name: str = "ids") -> torch.Tensor:
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.is_floating_point():
        what = tuple(ids.shape) if isinstance(ids, torch.Tensor) else type(ids).__name__
        raise ValueError(f"{where}: {name} must be token ids (B, T), an integer tensor, got {what}")
    return ids


def _check_two_copies(ids: object, where: str, name: str = "ids") -> int:
    """``n`` for ``ids = [r, r]`` ``(B, 2n)``, ``n >= 2``; else a ValueError: not two copies."""
    ids = _check_ids(ids, where, name)
    T = ids.size(1)
    n = T // 2
    if T % 2 or n < 2 or not torch.equal(ids[:, :n], ids[:, n:]):
        why = (f"an odd length {T}" if T % 2 else f"length {T}, copies of fewer than 2 tokens"
               if n < 2 else "the second half differs from the first")
        raise ValueError(f"{where}: {name} {tuple(ids.shape)} is not two copies [r, r] of a block r "
                         f"of at least 2 tokens ({why}); build it with induction.repeated_tokens")
    return n


@torch.no_grad()
def attention_patterns(model: GPT, ids: torch.Tensor) -> list[torch.Tensor]:
    """The attention weights of every layer on ``ids (B, T)``: a list of ``(B, h, T, T)``."""
    patterns = []
    attns = _attentions(model)
    fused = [a.fused for a in attns]
    hooks = [a.register_forward_hook(lambda m, i, o: patterns.append(m.attn_weights)) for a in attns]
    try:
        for a in attns:
            a.fused = False  # the readable path stores the weights
        model(ids)
    finally:
        for a, f, h in zip(attns, fused, hooks):
            a.fused = f
            h.remove()
    return patterns


def _check_pattern(pattern: torch.Tensor, where: str) -> torch.Tensor:
    """``pattern`` as a float tensor ``(B, h, T, T)`` (integer 0/1 patterns are accepted)."""
    if not isinstance(pattern, torch.Tensor):
        raise ValueError(f"{where}: pattern must be a tensor (B, h, T, T), got {type(pattern).__name__}")
    if pattern.dim() != 4 or pattern.size(-1) != pattern.size(-2):
        raise ValueError(f"{where}: pattern must be (B, h, T, T), got {tuple(pattern.shape)}")
    return pattern if pattern.is_floating_point() else pattern.float()


def previous_token_score(pattern: torch.Tensor) -> torch.Tensor:
    """``(B, h, T, T) -> (h,)``: mean weight from position i to i - 1 (i = 1 .. T-1)."""
    pattern = _check_pattern(pattern, "previous_token_score")
    if pattern.size(-1) < 2:
        raise ValueError(f"previous_token_score: needs at least 2 positions, got {tuple(pattern.shape)}")
    return pattern.diagonal(offset=-1, dim1=-2, dim2=-1).mean(dim=(0, 2))  # (B, h, T-1) -> (h,)


def duplicate_token_score(pattern: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """``(B, h, T, T)``, ``ids (B, T) -> (h,)``: mean total weight that a token puts on earlier
    positions holding the same token, over the positions that have such an earlier copy."""
    pattern = _check_pattern(pattern, "duplicate_token_score")
    _check_ids(ids, "duplicate_token_score")
    B, h, T, _ = pattern.shape
    if ids.shape != (B, T):
        raise ValueError(f"duplicate_token_score: ids {tuple(ids.shape)} do not fit the pattern "
                         f"{tuple(pattern.shape)}: ids must be (B, T) = {(B, T)}")
    same = ids[:, :, None] == ids[:, None, :]  # (B, T, T): same token at query and key
    earlier = torch.ones(T, T, dtype=torch.bool).tril(-1)  # (T, T): key strictly before query
    target = same & earlier  # (B, T, T)
    has = target.any(dim=-1)  # (B, T): a query with an earlier copy
    if not has.any():
        raise ValueError("duplicate_token_score: no token occurs twice in ids")
    weight = (pattern * target[:, None]).sum(dim=-1)  # (B, h, T)
    return (weight * has[:, None]).sum(dim=(0, 2)) / has.sum()  # (h,)


def induction_score(pattern: torch.Tensor, length: int) -> torch.Tensor:
    """``(B, h, 2n, 2n)`` on ``[r, r]`` with ``n = length -> (h,)``: mean weight from each position
    i of the second copy (n .. 2n-1) to i - n + 1, the token after the earlier occurrence."""
    pattern = _check_pattern(pattern, "induction_score")
    if isinstance(length, bool) or not isinstance(length, int) or length < 1:
        raise ValueError(f"induction_score: length must be an int >= 1 (the length n of r in "
                         f"[r, r]), got {length!r}")
    if pattern.size(-1) < 2 * length:
        raise ValueError(f"induction_score: pattern covers {pattern.size(-1)} positions, fewer than "
                         f"2 * length = {2 * length}")
    return pattern.diagonal(offset=-(length - 1), dim1=-2, dim2=-1)[..., 1 : length + 1].mean(dim=(0, 2))


def head_scores(model: GPT, ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """The three scores of every head on ``ids = [r, r]``: each ``(num_layers, h)``."""
    n = _check_two_copies(ids, "head_scores")
    patterns = attention_patterns(model, ids)
    return {
        "previous_token": torch.stack([previous_token_score(p) for p in patterns]),
        "duplicate_token": torch.stack([duplicate_token_score(p, ids) for p in patterns]),
        "induction": torch.stack([induction_score(p, n) for p in patterns]),
    }


@torch.no_grad()
def loss_per_position(model: GPT, ids: torch.Tensor) -> torch.Tensor:
    """``ids (B, T) -> (T-1,)``: the next-token loss (nats) at each position, averaged over rows;
    entry t is the loss of predicting token t + 1 from tokens 0..t."""
    _check_ids(ids, "loss_per_position")
    if ids.size(1) < 2 or ids.size(0) < 1:
        raise ValueError(f"loss_per_position: ids {tuple(ids.shape)} must hold at least one row of "
                         "2 or more tokens (one prediction needs a token and the next)")
    logits = model(ids[:, :-1])  # (B, T-1, V)
    return F.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none").mean(dim=0)


@torch.no_grad()
def head_outputs(model: GPT, ids: torch.Tensor) -> list[torch.Tensor]:
    """Each layer's head outputs before ``out_proj`` (TransformerLens's ``hook_z``), as
    ``(B, T, h, head_dim)``."""
    outputs = []

    def keep(module, args):
        outputs.append(args[0].view(*args[0].shape[:2], module_heads, -1).clone())  # (B, T, h, hd)

    module_heads = model.config.num_heads
    hooks = [a.out_proj.register_forward_pre_hook(keep) for a in _attentions(model)]
    try:
        model(ids)
    finally:
        for h in hooks:
            h.remove()
    return outputs


def _check_heads(num_heads: object, head: object, where: str) -> None:
    if isinstance(num_heads, bool) or not isinstance(num_heads, int) or num_heads < 1:
        raise ValueError(f"{where}: num_heads must be an int >= 1, got {num_heads!r}")
    _check_index(head, "head", num_heads, where)


def _split_heads(x: torch.Tensor, num_heads: int, where: str) -> torch.Tensor:
    """out_proj's input ``(B, T, h * hd)`` viewed as ``(B, T, h, hd)``."""
    if x.dim() != 3 or x.size(-1) % num_heads:
        raise ValueError(f"{where}: the hook was built for num_heads={num_heads}, but out_proj's "
                         f"input {tuple(x.shape)} does not split into {num_heads} heads: pass the "
                         "layer's own num_heads (model.config.num_heads)")
    return x.view(*x.shape[:2], num_heads, -1)  # (B, T, h, hd)


def ablation_hook(head: int, num_heads: int, mean: torch.Tensor | None = None) -> Callable:
    """A forward pre-hook for ``out_proj`` that removes head ``head``: its output becomes zero, or
    ``mean (head_dim,)`` or ``(T, head_dim)`` (mean-ablation). Returns the changed input."""
    _check_heads(num_heads, head, "ablation_hook")
    if mean is not None and not isinstance(mean, torch.Tensor):
        raise ValueError(f"ablation_hook: mean must be None or a tensor (head_dim,) or (T, head_dim), "
                         f"got {type(mean).__name__}")

    def hook(module, args):
        z = _split_heads(args[0], num_heads, "ablation_hook").clone()  # (B, T, h, hd)
        if mean is not None and mean.shape not in ((z.size(-1),), (z.size(1), z.size(-1))):
            raise ValueError(f"ablation_hook: mean must be (head_dim,) = ({z.size(-1)},) or "
                             f"(T, head_dim) = {(z.size(1), z.size(-1))}, got {tuple(mean.shape)}")
        z[:, :, head] = 0.0 if mean is None else mean
        return (z.view(args[0].shape),)

    hook.num_heads = num_heads  # hooked() checks it against the layer's
    return hook


def patching_hook(head: int, num_heads: int, clean: torch.Tensor,
                  position: int | None = None) -> Callable:
    """A forward pre-hook for ``out_proj`` that writes head ``head``'s output from a clean run,
    ``clean (B, T, h, hd)`` (``head_outputs``), into this run: at every position, or at one."""
    _check_heads(num_heads, head, "patching_hook")
    if not isinstance(clean, torch.Tensor) or clean.dim() != 4 or clean.size(2) != num_heads:
        what = tuple(clean.shape) if isinstance(clean, torch.Tensor) else type(clean).__name__
        raise ValueError(f"patching_hook: clean must be (B, T, num_heads={num_heads}, head_dim), "
                         f"one layer of interp.head_outputs, got {what}")
    if position is not None:
        _check_index(position, "position", clean.size(1), "patching_hook")

    def hook(module, args):
        z = _split_heads(args[0], num_heads, "patching_hook").clone()  # (B, T, h, hd)
        if z.shape != clean.shape:
            raise ValueError(f"patching_hook: this run's head outputs {tuple(z.shape)} and the "
                             f"clean ones {tuple(clean.shape)} differ in shape: read the clean run "
                             "on inputs of this run's shape")
        where = slice(None) if position is None else position
        z[:, where, head] = clean[:, where, head]
        return (z.view(args[0].shape),)

    hook.num_heads = num_heads  # hooked() checks it against the layer's
    return hook


@contextmanager
def hooked(model: GPT, layer: int, hook: Callable) -> Iterator[GPT]:
    """Run ``model`` with ``hook`` as a forward pre-hook on layer ``layer``'s ``out_proj``."""
    _check_model(model, "hooked")
    _check_index(layer, "layer", model.config.num_layers, "hooked")
    if not callable(hook):
        raise TypeError(f"hooked: hook must be a function hook(module, args), got {type(hook).__name__}")
    built_for = getattr(hook, "num_heads", None)  # set by ablation_hook and patching_hook
    if built_for is not None and built_for != _attentions(model)[layer].num_heads:
        raise ValueError(f"hooked: the hook was built for num_heads={built_for}, but layer {layer} "
                         f"has {_attentions(model)[layer].num_heads} heads: pass model.config.num_heads")
    handle = _attentions(model)[layer].out_proj.register_forward_pre_hook(hook)
    try:
        yield model
    finally:
        handle.remove()


def ablated_loss(model: GPT, ids: torch.Tensor, layer: int, head: int, how: str = "zero",
                 mean_ids: torch.Tensor | None = None) -> float:
    """Mean loss on the repeated half of ``ids = [r, r]`` with one head zero- or mean-ablated
    (the mean over rows and positions of ``mean_ids``, default ``ids``)."""
    if how not in ("zero", "mean"):
        raise ValueError(f"ablated_loss: how must be 'zero' or 'mean', got {how!r}")
    _check_model(model, "ablated_loss")
    n = _check_two_copies(ids, "ablated_loss")
    h = model.config.num_heads
    _check_index(layer, "layer", model.config.num_layers, "ablated_loss")
    _check_index(head, "head", h, "ablated_loss")
    mean = None
    if how == "mean":
        mean = head_outputs(model, ids if mean_ids is None else mean_ids)[layer][:, :, head].mean(dim=(0, 1))
    with hooked(model, layer, ablation_hook(head, h, mean)):
        return loss_per_position(model, ids)[n - 1 :].mean().item()


def ablation_table(model: GPT, ids: torch.Tensor, how: str = "zero") -> torch.Tensor:
    """``(num_layers, h)``: the repeated half's loss with each head ablated in turn."""
    c = model.config
    return torch.tensor([[ablated_loss(model, ids, l, h, how) for h in range(c.num_heads)]
                         for l in range(c.num_layers)])


@torch.no_grad()
def patching_table(model: GPT, clean: torch.Tensor, corrupted: torch.Tensor) -> torch.Tensor:
    """Activation patching: ``(num_layers, h)``; for each head, the fraction of the loss gap on the
    repeated half that patching that head's output (every position) from the ``clean`` run into
    the ``corrupted`` run closes: 0 = nothing, 1 = all of it.

    ``clean = [r, r]`` and ``corrupted = [r', r]`` ``(B, 2n)`` (the first copy replaced): both are
    scored against ``clean``'s next tokens on the second half, which only a copy can predict.
    """
    c = _check_model(model, "patching_table").config
    n = _check_two_copies(clean, "patching_table", "clean")
    _check_ids(corrupted, "patching_table", "corrupted")
    if clean.shape != corrupted.shape:
        raise ValueError(f"patching_table: clean {tuple(clean.shape)} and corrupted "
                         f"{tuple(corrupted.shape)} must have the same shape")
    if not torch.equal(corrupted[:, n:], clean[:, n:]):
        raise ValueError("patching_table: corrupted must be [r', r], its second half equal to clean's")
    if torch.equal(clean, corrupted):
        raise ValueError("patching_table: clean and corrupted are the same ids: there is no gap "
                         "to close, nothing to patch; replace corrupted's first half")

    def loss(ids: torch.Tensor) -> torch.Tensor:
        logits = model(ids[:, :-1])[:, n - 1 :]  # (B, n, V): predictions of the second half
        return F.cross_entropy(logits.transpose(1, 2), clean[:, n:])

    clean_z = head_outputs(model, clean[:, :-1])
    low, high = loss(corrupted), loss(clean)
    if not (low - high).abs() > 1e-6:
        raise ValueError(f"patching_table: the clean and corrupted runs have the same loss "
                         f"({high.item():.4g} and {low.item():.4g} nats): there is no gap to close")
    table = torch.zeros(c.num_layers, c.num_heads)
    for layer in range(c.num_layers):
        for head in range(c.num_heads):
            with hooked(model, layer, patching_hook(head, c.num_heads, clean_z[layer])):
                table[layer, head] = (low - loss(corrupted)) / (low - high)
    return table


@torch.no_grad()
def key_path_ablation(model: GPT, ids: torch.Tensor, head0: int) -> torch.Tensor:
    """K-composition, measured: layer 1's induction scores ``(h,)`` on ``ids = [r, r]`` when layer
    1's KEYS are computed from a residual stream without layer-0 head ``head0``'s output, while its
    queries and values keep it (path ablation of one path: head0 -> layer-1 keys)."""
    _check_model(model, "key_path_ablation")
    if model.config.num_layers != 2 or not model.config.attn_only:
        raise ValueError("key_path_ablation: reads a 2-layer attention-only model")
    _check_index(head0, "head0", model.config.num_heads, "key_path_ablation")
    n = _check_two_copies(ids, "key_path_ablation")
    layer0, layer1 = model.blocks.layers
    attn0, attn1 = layer0.self_attn, layer1.self_attn
    x0 = model.embed(ids)  # (B, T, d)
    z0 = head_outputs(model, ids)[0]  # (B, T, h, hd)
    h0 = layer0.norm1(x0)
    x1 = x0 + attn0(h0, h0, h0, is_causal=True)  # (B, T, d): the stream after layer 0
    w_o = attn0.out_proj.weight.view(-1, attn0.num_heads, attn0.head_dim)[:, head0]  # (d, hd)
    without = x1 - z0[:, :, head0] @ w_o.T  # (B, T, d): head0's write removed
    k, _ = attn1.project_kv(layer1.norm1(without), layer1.norm1(without))  # (B, h, T, hd)
    _, v = attn1.project_kv(layer1.norm1(x1), layer1.norm1(x1))
    mask = torch.ones(ids.size(1), ids.size(1), dtype=torch.bool).tril()  # (T, T) causal
    _, pattern = attn1.attend(layer1.norm1(x1), k, v, mask, return_attention=True)
    return induction_score(pattern, n)


@torch.no_grad()
def direct_logit_attribution(model: GPT, ids: torch.Tensor, targets: torch.Tensor) -> dict[str, torch.Tensor]:
    """How much each part of the residual stream adds to the logit of ``targets (B, T)`` at each
    position of ``ids (B, T)``, through the final LayerNorm with its scale frozen at the full
    stream's. Returns ``{"embed": (B, T), "heads": (num_layers, h, B, T), "bias": (B, T)}``; their
    sum over parts is the logit exactly (``model(ids)`` gathered at ``targets``)."""
    where = "direct_logit_attribution"
    _check_model(model, where)
    if not model.config.attn_only:
        raise ValueError("direct_logit_attribution: reads an attention-only model")
    _check_ids(ids, where)
    _check_ids(targets, where, "targets")
    if targets.shape != ids.shape:
        raise ValueError(f"{where}: targets {tuple(targets.shape)} must have the shape of ids "
                         f"{tuple(ids.shape)}, one target token per position; for next-token targets "
                         "pass ids[:, :-1] as ids and ids[:, 1:] as targets")
    vocab = model.config.vocab_size
    if targets.numel() and not (0 <= targets.min().item() and targets.max().item() < vocab):
        raise ValueError(f"{where}: targets must be token ids in 0 .. {vocab - 1} (the model's "
                         f"vocabulary), got values {targets.min().item()} .. {targets.max().item()}")
    norm = model.blocks.norm
    x = model.embed(ids)  # (B, T, d)
    parts = [x]
    heads = []
    for layer, z in zip(model.blocks.layers, head_outputs(model, ids)):
        attn = layer.self_attn
        w_o = attn.out_proj.weight.view(-1, attn.num_heads, attn.head_dim)  # (d, h, hd)
        per_head = torch.einsum("bthk,dhk->hbtd", z, w_o)  # (h, B, T, d)
        heads.append(per_head)
        bias = attn.out_proj.bias if attn.out_proj.bias is not None else 0.0
        parts.append(per_head.sum(0) + bias)
        x = x + per_head.sum(0) + bias
    scale = (x.var(dim=-1, unbiased=False, keepdim=True) + norm.eps).sqrt()  # (B, T, 1)
    direction = model.lm_head.weight[targets] * norm.weight  # (B, T, d)

    def through(v: torch.Tensor) -> torch.Tensor:  # centred, scaled, read along the target
        return ((v - v.mean(dim=-1, keepdim=True)) / scale * direction).sum(-1)

    head_part = torch.stack([through(h) for h in heads])  # (L, h, B, T)
    out_biases = sum(through(torch.zeros_like(x) + (layer.self_attn.out_proj.bias
                                                     if layer.self_attn.out_proj.bias is not None
                                                     else 0.0))
                     for layer in model.blocks.layers)
    bias = out_biases + (model.lm_head.weight[targets] * norm.bias).sum(-1)  # (B, T)
    return {"embed": through(model.embed(ids)), "heads": head_part, "bias": bias}


@torch.no_grad()
def full_ov_circuit(model: GPT, layer: int, head: int) -> torch.Tensor:
    """The full OV circuit of head ``layer.head`` (Elhage et al. 2021): ``(V, V)``, row ``a`` = what
    the head adds to every logit when it attends to a position holding token ``a``, through
    ``W_E W_V W_O W_U``. LayerNorm is folded in as a linear map: each embedding is centred, the
    layer's ``norm1`` gain scales what ``W_V`` reads and the final norm's gain what ``W_U`` reads
    (both norms' division by the stream's spread is left out, as in ARENA and TransformerLens's
    folded weights); biases are left out."""
    _check_model(model, "full_ov_circuit")
    if not model.config.attn_only:
        raise ValueError("full_ov_circuit: reads an attention-only model")
    _check_index(layer, "layer", model.config.num_layers, "full_ov_circuit")
    blocks = model.blocks.layers
    attn = blocks[layer].self_attn
    _check_index(head, "head", attn.num_heads, "full_ov_circuit")
    hd, group = attn.head_dim, attn.num_heads // attn.num_kv_heads
    w_e = model.embed.token.embedding.weight  # (V, d)
    w_e = (w_e - w_e.mean(dim=-1, keepdim=True)) * blocks[layer].norm1.weight  # centred, scaled
    kv = head // group  # the key/value head this query head reads (grouped-query attention)
    w_v = attn.v_proj.weight[kv * hd : (kv + 1) * hd].T  # (d, hd)
    w_o = attn.out_proj.weight[:, head * hd : (head + 1) * hd].T  # (hd, d)
    w_u = model.lm_head.weight.T * model.blocks.norm.weight[:, None]  # (d, V)
    return w_e @ w_v @ w_o @ w_u  # (V, V)


def copying_scores(circuit: torch.Tensor) -> dict[str, float]:
    """Two copying measures of a full OV circuit ``(V, V)``: ``"top1"``, the share of tokens whose
    own logit is the largest in their row (1/V by chance for a random matrix), and ``"eigen"``,
    the sum of the eigenvalues' real parts over the sum of their sizes, in [-1, 1] (1: every
    eigenvalue positive, the map adds to its input; the Framework paper's copying score)."""
    if not isinstance(circuit, torch.Tensor) or circuit.dim() != 2 or circuit.size(0) != circuit.size(1):
        what = tuple(circuit.shape) if isinstance(circuit, torch.Tensor) else type(circuit).__name__
        raise ValueError(f"copying_scores: circuit must be a square (V, V) tensor, got {what}")
    circuit = circuit.double()
    top1 = (circuit.argmax(dim=-1) == torch.arange(circuit.size(0))).double().mean().item()
    eig = torch.linalg.eigvals(circuit)  # (V,) complex
    return {"top1": top1, "eigen": (eig.real.sum() / eig.abs().sum()).item()}
