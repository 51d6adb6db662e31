"""Solutions to the exercises of lesson 12 (inside a trained model); see ``course_lib.solutions``.

``PATCHING_HOOK_BUG`` is the buggy patching hook of the Debug exercise (12.patching_hook), kept
here so that the notebook shows and the tests run the very same text.
"""

from __future__ import annotations

import torch

PATCHING_HOOK_BUG = '''\
def my_patching_hook(head, num_heads, clean, position=None):
    """A forward pre-hook for a layer's out_proj: write head `head`'s output from the clean run,
    clean (B, T, h, hd), into this run, at every position (position=None) or at one position."""

    def hook(module, args):
        z = args[0].clone()  # (B, T, h * hd): leave PyTorch's own tensor alone
        B, T, _ = z.shape
        z = z.view(B, T, num_heads, -1)  # (B, T, h, hd): one slice per head
        if position:
            z[:, position, head] = clean[:, position, head]  # one position
        else:
            z[:, :, head] = clean[:, :, head]  # every position
        return z.view(B, T, -1)  # (B, T, h * hd): the shape out_proj expects

    return hook
'''


# %% solution 12.induction_score
def my_induction_score(pattern, length):
    """pattern (B, h, 2n, 2n) on [r, r] with n = length -> (h,): the mean weight from each
    position i of the second copy to i - n + 1, the token after i's earlier occurrence."""
    n = length
    queries = torch.arange(n, 2 * n)  # (n,): every position of the second copy
    keys = queries - n + 1  # (n,): one step after the same token in the first copy
    weights = pattern[:, :, queries, keys]  # (B, h, n): the weight each query puts on its key
    return weights.mean(dim=(0, 2))  # (h,): averaged over the batch and the positions


# %% solution 12.ablation_hook
def my_ablation_hook(head, num_heads, mean=None):
    """A forward pre-hook for out_proj: head `head`'s output (its slice of the input
    (B, T, num_heads * head_dim)) becomes 0, or `mean` ((head_dim,) or (T, head_dim))."""

    def hook(module, args):
        z = args[0]  # (B, T, num_heads * head_dim): the heads side by side
        head_dim = z.size(-1) // num_heads
        start, stop = head * head_dim, (head + 1) * head_dim  # head `head`'s slice
        z = z.clone()  # a new tensor: the hook returns it, so the input need not change
        z[..., start:stop] = 0.0 if mean is None else mean
        return z  # a pre-hook's return value replaces the module's input

    return hook


# %% solution 12.predict_ablation
def predicted_ablation_losses():
    clean, uncopyable = 0.38, 4.4  # section 3: the repeated copy's loss; the first copy's
    # Head 0.3 is the one strong previous-token head. Every induction head finds its target through
    # keys that hold "the token before me", which head 0.3 writes (K-composition): removing it
    # weakens all four induction heads at once, so most of the copy is lost. Not all of it: heads
    # 0.0 and 0.1 also attend to the previous token part of the time, so part of it is still written.
    # The loss rises most of the way towards an uncopyable copy: say two thirds of the way.
    head_0_3 = clean + 2 / 3 * (uncopyable - clean)
    # One induction head of four: the three others still attend to the right position and write
    # the right token, so the copy survives. But the four share the push towards that token, and
    # with a quarter of it gone the token's lead shrinks: the loss rises a few times over, and
    # stays far below the loss without head 0.3.
    one_induction_head = 3 * clean
    return head_0_3, one_induction_head


# %% solution 12.patching_hook
def my_patching_hook(head, num_heads, clean, position=None):
    """A forward pre-hook for a layer's out_proj: write head `head`'s output from the clean run,
    clean (B, T, h, hd), into this run, at every position (position=None) or at one position."""

    def hook(module, args):
        z = args[0].clone()  # (B, T, h * hd): leave PyTorch's own tensor alone
        B, T, _ = z.shape
        z = z.view(B, T, num_heads, -1)  # (B, T, h, hd): one slice per head
        # The fix: `if position:` is False for position 0 (0 is falsy, like None), so position 0
        # took the every-position branch. Only None means "every position": ask exactly that.
        if position is not None:
            z[:, position, head] = clean[:, position, head]  # one position
        else:
            z[:, :, head] = clean[:, :, head]  # every position
        return z.view(B, T, -1)  # (B, T, h * hd): the shape out_proj expects

    return hook


# %% solution 12.patching_table
@torch.no_grad()
def my_patching_table(model, clean, corrupted):
    """clean = [r, r], corrupted = [r', r] (B, 2n) -> (num_layers, h): the fraction of the
    repeated half's loss gap that patching one head's output from clean into corrupted closes."""
    import torch.nn.functional as F

    num_layers, num_heads = model.config.num_layers, model.config.num_heads
    n = clean.size(1) // 2
    targets = clean[:, n:]  # (B, n): the second half's tokens, the same in both runs

    def second_half_loss(ids):
        logits = model(ids[:, :-1])  # (B, 2n-1, V): position t predicts token t + 1
        return F.cross_entropy(logits[:, n - 1 :].transpose(1, 2), targets).item()

    # Each layer's head outputs on the clean run, read by a hook on out_proj's input.
    saved = {}

    def keeper(layer):
        def keep(module, args):
            saved[layer] = args[0].clone()  # (B, 2n-1, h * hd)
        return keep

    projections = [block.self_attn.out_proj for block in model.blocks.layers]
    handles = [p.register_forward_pre_hook(keeper(i)) for i, p in enumerate(projections)]
    try:
        clean_loss = second_half_loss(clean)
    finally:
        for handle in handles:
            handle.remove()
    corrupted_loss = second_half_loss(corrupted)
    gap = corrupted_loss - clean_loss  # what a perfect patch would recover

    table = torch.zeros(num_layers, num_heads)
    for layer in range(num_layers):
        clean_z = saved[layer].view(*saved[layer].shape[:2], num_heads, -1)  # (B, 2n-1, h, hd)
        for head in range(num_heads):
            def patch(module, args, head=head):  # clean head output in, every position
                z = args[0].view(*args[0].shape[:2], num_heads, -1).clone()  # (B, 2n-1, h, hd)
                z[:, :, head] = clean_z[:, :, head]
                return z.view(args[0].shape)  # returned, so out_proj receives it

            handle = projections[layer].register_forward_pre_hook(patch)
            try:
                patched_loss = second_half_loss(corrupted)
            finally:
                handle.remove()  # never leave a hook behind
            table[layer, head] = (corrupted_loss - patched_loss) / gap
    return table


# %% solution 12.ov_circuit
def my_full_ov_circuit(model, layer, head):
    """The full OV circuit (V, V) of head `layer`.`head`: row a is what the head adds to every
    logit when it attends to a position holding token a, LayerNorm folded in (centring, gains)."""
    block = model.blocks.layers[layer]
    attn = block.self_attn
    hd = attn.head_dim
    group = attn.num_heads // attn.num_kv_heads  # query heads per key/value head (GQA)
    kv = head // group  # the key/value head this query head reads
    w_e = model.embed.token.embedding.weight  # (V, d): one row per token
    x = (w_e - w_e.mean(dim=-1, keepdim=True)) * block.norm1.weight  # (V, d): what LayerNorm passes on
    w_v = attn.v_proj.weight[kv * hd:(kv + 1) * hd]  # (hd, d): nn.Linear stores (out, in)
    w_o = attn.out_proj.weight[:, head * hd:(head + 1) * hd]  # (d, hd): this head's columns
    w_u = model.lm_head.weight * model.blocks.norm.weight  # (V, d): the final gain folded in
    with torch.no_grad():
        return x @ w_v.T @ w_o.T @ w_u.T  # (V, d) (d, hd) (hd, d) (d, V) -> (V, V)
