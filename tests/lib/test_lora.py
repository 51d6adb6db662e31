"""course_lib.lora against PEFT 0.21.2 (lesson 15): LoRA by hand equals PEFT's LoraModel.

The reference is PEFT on Hugging Face's ``GPT2LMHeadModel`` carrying the course GPT's weights
(``course_lib.gpt.load_into_hf_gpt2``; random weights from a small config, nothing downloaded), with
PEFT's GPT-2 names ``c_attn``, ``c_proj``, ``c_fc`` on both sides, and the same ``A`` and ``B``
(ours copied into PEFT's; ``B`` made non-zero first, or every LoRA would equal its base). In float64:
logits within 1e-10 (measured 3.3e-16; rsLoRA 8.9e-16), the gradients of every ``A`` and ``B``
within 1e-10 (measured <= 8.3e-17; no gradient on any other parameter, on either side), and the
merged weights equal to PEFT's ``merge_and_unload()`` (measured: 0, bitwise). Separate q, k, v adapters (the
default targets) are checked against PEFT injected into course_lib's own GPT.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from peft import LoraConfig, get_peft_model, inject_adapter_in_model
from torch import nn
from transformers import GPT2LMHeadModel

from course_lib.gpt import GPT, GPTConfig, hf_gpt2_config, lm_loss, load_into_hf_gpt2
from course_lib.lora import (DEFAULT_TARGET, LoRALinear, add_lora, lora_layers, lora_parameters,
                             merge_and_unload, merge_lora, set_adapter, trainable_parameters,
                             unmerge_lora)

TOL = 1e-10
PEFT_NAMES = ["c_attn", "c_proj", "c_fc"]
CONFIG = GPTConfig(vocab_size=23, max_len=16, d_model=24, num_heads=3, num_layers=2, d_ff=40)


@torch.no_grad()
def _base(dtype=torch.float64, seed: int = 0) -> GPT:
    """A small GPT whose biases and LayerNorms are not 0 and 1 (so a port that drops them fails)."""
    torch.manual_seed(seed)
    model = GPT(CONFIG).to(dtype).eval()
    for p in model.parameters():
        p.add_(0.05 * torch.randn_like(p))
    return model


def _hf(model: GPT) -> GPT2LMHeadModel:
    hf = GPT2LMHeadModel(hf_gpt2_config(model.config)).to(model.lm_head.weight.dtype).eval()
    load_into_hf_gpt2(model, hf)
    return hf


@torch.no_grad()
def _randomise_B(model: nn.Module, adapter: str | None = None, std: float = 0.1) -> None:
    for layer in lora_layers(model).values():
        name = adapter or layer.active_adapter
        if name in layer.lora_B:
            layer.lora_B[name].normal_(0.0, std)


def _peft_layers(peft_model, i: int) -> dict[str, nn.Module]:
    block = peft_model.base_model.model.transformer.h[i]
    return {"c_attn": block.attn.c_attn, "attn.c_proj": block.attn.c_proj, "c_fc": block.mlp.c_fc,
            "mlp.c_proj": block.mlp.c_proj}


def _ours_as_peft(model: GPT, i: int, adapter: str) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Our (A, B) of layer i under PEFT's GPT-2 names: c_attn's B is q's, k's and v's rows."""
    layer = model.blocks.layers[i]
    attn, ff = layer.self_attn, layer.feed_forward
    assert attn.k_proj.lora_A[adapter] is attn.q_proj.lora_A[adapter]  # one shared A, as c_attn's
    B_qkv = torch.cat([attn.q_proj.lora_B[adapter], attn.k_proj.lora_B[adapter],
                       attn.v_proj.lora_B[adapter]])  # (3d, r)
    return {"c_attn": (attn.q_proj.lora_A[adapter], B_qkv),
            "attn.c_proj": (attn.out_proj.lora_A[adapter], attn.out_proj.lora_B[adapter]),
            "c_fc": (ff.linear1.lora_A[adapter], ff.linear1.lora_B[adapter]),
            "mlp.c_proj": (ff.linear2.lora_A[adapter], ff.linear2.lora_B[adapter])}


@torch.no_grad()
def _copy_into_peft(model: GPT, peft_model, adapter: str = "default") -> None:
    for i in range(model.config.num_layers):
        ours = _ours_as_peft(model, i, adapter)
        for name, layer in _peft_layers(peft_model, i).items():
            layer.lora_A[adapter].weight.copy_(ours[name][0])
            layer.lora_B[adapter].weight.copy_(ours[name][1])


def _pair(r=4, alpha=8, rslora=False, dropout=0.0):
    """(ours, PEFT's, ids): the same GPT and the same A and B on both sides, float64."""
    model = _base()
    peft_model = get_peft_model(_hf(model), LoraConfig(
        r=r, lora_alpha=alpha, target_modules=PEFT_NAMES, fan_in_fan_out=True, use_rslora=rslora,
        lora_dropout=dropout))
    add_lora(model, r, alpha, target=PEFT_NAMES, rslora=rslora, dropout=dropout)
    _randomise_B(model)
    _copy_into_peft(model, peft_model)
    ids = torch.randint(0, CONFIG.vocab_size, (3, CONFIG.max_len), generator=torch.Generator().manual_seed(1))
    return model, peft_model, ids


@pytest.mark.parametrize("rslora", [False, True])
def test_equal_to_peft_logits_and_gradients(rslora):
    model, peft_model, ids = _pair(r=4, alpha=8, rslora=rslora)  # alpha/r = 2, alpha/sqrt(r) = 4
    scaling = next(iter(lora_layers(model).values())).scaling["default"]
    assert scaling == (8 / math.sqrt(4) if rslora else 8 / 4)
    assert scaling == peft_model.base_model.model.transformer.h[0].attn.c_attn.scaling["default"]
    ours, theirs = model(ids), peft_model(input_ids=ids).logits
    assert (ours - theirs).abs().max() <= TOL
    assert (ours - _base()(ids)).abs().max() > 1e-3  # the adapters do change the model
    y = torch.roll(ids, -1, dims=1)
    lm_loss(ours, y).backward()
    lm_loss(theirs, y).backward()
    for i in range(CONFIG.num_layers):
        mine = _ours_as_peft(model, i, "default")
        grads_B = {"c_attn": torch.cat([model.blocks.layers[i].self_attn.q_proj.lora_B["default"].grad,
                                        model.blocks.layers[i].self_attn.k_proj.lora_B["default"].grad,
                                        model.blocks.layers[i].self_attn.v_proj.lora_B["default"].grad])}
        for name, layer in _peft_layers(peft_model, i).items():
            A, B = mine[name]
            assert (A.grad - layer.lora_A["default"].weight.grad).abs().max() <= TOL
            grad_B = grads_B[name] if name in grads_B else B.grad
            assert (grad_B - layer.lora_B["default"].weight.grad).abs().max() <= TOL
            assert A.grad.abs().max() > 0
    trained = {id(p) for p in lora_parameters(model)}
    assert all(p.grad is None for p in model.parameters() if id(p) not in trained)
    assert all(p.grad is None for n, p in peft_model.named_parameters() if "lora_" not in n)


def test_merged_weights_equal_peft_merge_and_unload():
    model, peft_model, ids = _pair()
    theirs = peft_model.merge_and_unload()  # a plain GPT2LMHeadModel again
    ours = merge_and_unload(model)
    assert not lora_layers(ours)
    ported = _hf(ours)  # our merged weights through the course's port
    theirs_state = theirs.state_dict()
    for name, tensor in ported.state_dict().items():
        assert (tensor - theirs_state[name]).abs().max() <= TOL, name  # measured: 0 (bitwise)
    assert (ours(ids) - theirs(ids).logits).abs().max() <= TOL


def test_separate_qkv_equal_to_peft_on_course_gpt():
    """The default targets (course_lib's names, one A per projection) against PEFT injected into a
    copy of course_lib's own GPT: logits, gradients, trainable parameter counts."""
    model = _base()
    theirs = inject_adapter_in_model(LoraConfig(r=3, lora_alpha=5, target_modules=list(DEFAULT_TARGET)),
                                     copy.deepcopy(model))
    add_lora(model, 3, 5)
    _randomise_B(model)
    theirs_params = dict(theirs.named_parameters())
    with torch.no_grad():
        for name, layer in lora_layers(model).items():
            theirs_params[f"{name}.lora_A.default.weight"].copy_(layer.A)
            theirs_params[f"{name}.lora_B.default.weight"].copy_(layer.B)
    assert trainable_parameters(model) == trainable_parameters(theirs) == sum(
        3 * (lin.in_features + lin.out_features) for lin in lora_layers(model).values())
    ids = torch.randint(0, CONFIG.vocab_size, (2, 16))
    y = torch.roll(ids, -1, dims=1)
    ours_logits, theirs_logits = model(ids), theirs(ids)
    assert (ours_logits - theirs_logits).abs().max() <= TOL
    lm_loss(ours_logits, y).backward()
    lm_loss(theirs_logits, y).backward()
    for name, layer in lora_layers(model).items():
        assert (layer.A.grad - theirs_params[f"{name}.lora_A.default.weight"].grad).abs().max() <= TOL
        assert (layer.B.grad - theirs_params[f"{name}.lora_B.default.weight"].grad).abs().max() <= TOL


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_merge_keeps_logits_and_unmerge_restores_W(dtype):
    """Merged logits equal unmerged ones to float rounding (float64 <= 1e-12, float32 <= 1e-5).
    Unmerging subtracts the very ΔW it added (the same matmul on the same A, B), so W comes back to
    within one rounding of W + ΔW: |W'' - W| <= eps · |W + ΔW| elementwise (at most half an ulp
    lost in each of the two additions). Measured (seed 0, B ~ N(0, 0.3²), |W + ΔW| <= 1.4):
    float64 max 1.1e-16 = 0.50 eps · |W + ΔW| (96% of the entries exactly restored), float32 max
    3.0e-8 = 0.94 eps · |W + ΔW| (16% exact); merged against unmerged logits 5.3e-16 and 3.6e-7.
    Bitwise restoration is not promised: W + ΔW is rounded."""
    torch.manual_seed(0)
    model = GPT(CONFIG).to(dtype).eval()
    add_lora(model, 4, 16)
    _randomise_B(model, std=0.3)
    ids = torch.randint(0, CONFIG.vocab_size, (3, 16))
    before = {n: layer.weight.detach().clone() for n, layer in lora_layers(model).items()}
    with torch.no_grad():
        unmerged = model(ids)
        merge_lora(model)
        merged = model(ids)
    assert (merged - unmerged).abs().max() <= (1e-12 if dtype == torch.float64 else 1e-5)
    for name, layer in lora_layers(model).items():
        assert layer.merged
        assert (layer.weight - before[name] - layer.get_delta_weight()).abs().max() <= 1e-6
    merged_W = {n: layer.weight.detach().clone() for n, layer in lora_layers(model).items()}
    unmerge_lora(model)
    eps = torch.finfo(dtype).eps
    for name, layer in lora_layers(model).items():
        assert not layer.merged
        error = (layer.weight - before[name]).abs()
        assert (error <= eps * merged_W[name].abs()).all(), name
    with torch.no_grad():
        assert (model(ids) - unmerged).abs().max() <= (1e-12 if dtype == torch.float64 else 1e-5)


def test_merged_forward_does_not_use_A_and_B():
    model = _base()
    add_lora(model, 2, 4)
    _randomise_B(model)
    merge_lora(model)
    ids = torch.randint(0, CONFIG.vocab_size, (2, 8))
    assert not model(ids).requires_grad  # A and B are trainable but unused: no graph at all


def test_starts_as_the_base_and_A_is_initialised_as_peft():
    model = _base()
    base_logits = model(torch.arange(16).unsqueeze(0))
    add_lora(model, 8, 16)
    assert torch.equal(model(torch.arange(16).unsqueeze(0)), base_logits)  # B = 0: nothing changed
    # PEFT: nn.init.kaiming_uniform_(A, a=sqrt(5)) -> uniform on +-1/sqrt(d_in); B zeros.
    linear = nn.Linear(400, 300)
    torch.manual_seed(3)
    big = LoRALinear(linear, r=64, alpha=8)
    torch.manual_seed(3)
    expected = nn.init.kaiming_uniform_(torch.empty(64, 400), a=math.sqrt(5))
    assert torch.equal(big.A.detach(), expected)
    bound = 1 / math.sqrt(400)
    assert big.A.abs().max() <= bound and big.A.abs().max() > 0.99 * bound
    assert abs(big.A.std().item() - bound / math.sqrt(3)) < 0.01 * bound
    assert not big.B.any()
    peft = inject_adapter_in_model(LoraConfig(r=64, lora_alpha=8, target_modules=["lin"]),
                                   nn.ModuleDict({"lin": nn.Linear(400, 300)}))
    theirs = peft["lin"].lora_A["default"].weight
    assert theirs.abs().max() <= bound and theirs.abs().max() > 0.99 * bound
    assert not peft["lin"].lora_B["default"].weight.any()


def test_only_A_and_B_train():
    model = _base()
    add_lora(model, 2, 4)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    assert trainable_parameters(model) == sum(p.numel() for p in lora_parameters(model))
    base = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    optimizer = torch.optim.AdamW(lora_parameters(model), lr=1e-2)
    ids = torch.randint(0, CONFIG.vocab_size, (2, 16))
    for _ in range(3):
        optimizer.zero_grad()
        lm_loss(model(ids), torch.roll(ids, -1, dims=1)).backward()
        optimizer.step()
    assert all(torch.equal(p, base[n]) for n, p in model.named_parameters() if n in base)
    assert any(layer.B.abs().max() > 0 for layer in lora_layers(model).values())


def test_dropout_only_on_the_unmerged_path_in_train_mode():
    torch.manual_seed(0)
    layer = LoRALinear(nn.Linear(6, 5).double(), r=2, alpha=4, dropout=0.5)
    with torch.no_grad():
        layer.B.normal_()
    x = torch.randn(7, 6, dtype=torch.float64)
    formula = layer.base_layer(x) + (x @ layer.A.T @ layer.B.T) * 2.0
    layer.eval()
    assert (layer(x) - formula).abs().max() <= TOL  # eval: no dropout
    layer.train()
    torch.manual_seed(5)
    out = layer(x)
    torch.manual_seed(5)
    dropped = torch.nn.functional.dropout(x, 0.5, training=True)
    assert (out - (layer.base_layer(x) + (dropped @ layer.A.T @ layer.B.T) * 2.0)).abs().max() <= TOL
    assert (out - formula).abs().max() > 1e-3
    # PEFT's layer, same A, B and seed: the same mask (its base draws no random numbers).
    peft = inject_adapter_in_model(LoraConfig(r=2, lora_alpha=4, lora_dropout=0.5, target_modules=["lin"]),
                                   nn.ModuleDict({"lin": copy.deepcopy(layer.base_layer)}))["lin"].train()
    with torch.no_grad():
        peft.lora_A["default"].weight.copy_(layer.A)
        peft.lora_B["default"].weight.copy_(layer.B)
    torch.manual_seed(5)
    assert (peft(x) - out).abs().max() <= TOL
    layer.merge()  # merged in train mode: no dropout is left, it computes the eval output
    assert (layer(x) - formula).abs().max() <= TOL


def test_two_adapters_switched_on_one_base_equal_peft():
    model, peft_model, ids = _pair(r=4, alpha=8)
    add_lora(model, 2, 6, target=PEFT_NAMES, adapter="plays")
    _randomise_B(model, "plays")
    peft_model.add_adapter("plays", LoraConfig(r=2, lora_alpha=6, target_modules=PEFT_NAMES,
                                               fan_in_fan_out=True))
    _copy_into_peft(model, peft_model, "plays")
    weights = [p.data_ptr() for n, p in model.named_parameters() if "lora_" not in n]
    results = {}
    for name in ("default", "plays", "default"):
        set_adapter(model, name)
        peft_model.set_adapter(name)
        ours = model(ids)
        assert (ours - peft_model(input_ids=ids).logits).abs().max() <= TOL
        assert {id(p) for p in model.parameters() if p.requires_grad} == {id(p) for p in lora_parameters(model)}
        assert all(name in n.split(".") for n, p in model.named_parameters() if p.requires_grad)
        if name in results:
            assert torch.equal(results[name], ours)  # switching back changes nothing
        results[name] = ours
    assert (results["default"] - results["plays"]).abs().max() > 1e-3
    # one set of base weights, the same tensors whatever the adapter; an adapter costs its A and B
    assert weights == [p.data_ptr() for n, p in model.named_parameters() if "lora_" not in n]
    assert sum(p.numel() for n, p in model.named_parameters() if "lora_" not in n) == sum(
        p.numel() for p in _base().parameters())


def test_bad_inputs():
    linear = nn.Linear(4, 3)
    for r in (0, -1, 2.0, True, None):
        with pytest.raises(ValueError, match="r .the rank. must be an int >= 1"):
            LoRALinear(linear, r, 1.0)
    for alpha in (0, -2.0, float("nan"), float("inf"), "8"):
        with pytest.raises(ValueError, match="alpha must be a finite number > 0"):
            LoRALinear(linear, 2, alpha)
    with pytest.raises(ValueError, match="dropout must be a number in"):
        LoRALinear(linear, 2, 4, dropout=1.0)
    with pytest.raises(TypeError, match="rslora must be True or False"):
        LoRALinear(linear, 2, 4, rslora=1)
    with pytest.raises(TypeError, match="base must be an nn.Linear, got Conv1d"):
        LoRALinear(nn.Conv1d(4, 3, 1), 2, 4)
    with pytest.raises(TypeError, match="already a LoRALinear"):
        LoRALinear(LoRALinear(linear, 2, 4), 2, 4)
    layer = LoRALinear(nn.Linear(4, 3), 2, 4)
    with pytest.raises(ValueError, match=r"x must be \(..., d_in=4\), got \(2, 5\)"):
        layer(torch.randn(2, 5))
    with pytest.raises(ValueError, match="nothing is merged"):
        layer.unmerge()
    layer.merge()
    with pytest.raises(ValueError, match="already merged; merging twice"):
        layer.merge()
    model = _base()
    with pytest.raises(ValueError, match="unknown target 'query'"):
        add_lora(model, 2, 4, target=["query"])
    with pytest.raises(ValueError, match="either 'c_attn' or the separate names"):
        add_lora(model, 2, 4, target=["c_attn", "q_proj"])
    with pytest.raises(TypeError, match="model must be an nn.Module"):
        add_lora("gpt", 2, 4)
    with pytest.raises(ValueError, match="no nn.Linear called"):
        add_lora(nn.Sequential(nn.ReLU()), 2, 4)
    with pytest.raises(ValueError, match="has no LoRALinear"):
        merge_lora(model)
    add_lora(model, 2, 4)
    with pytest.raises(ValueError, match="already has an adapter 'default'"):
        add_lora(model, 2, 4)
    with pytest.raises(ValueError, match="no adapter 'poems'"):
        set_adapter(model, "poems")
    with pytest.raises(ValueError, match="Python identifier"):
        add_lora(model, 2, 4, adapter="my adapter")
    merge_lora(model)
    with pytest.raises(ValueError, match="already merged"):
        merge_lora(model)
    with pytest.raises(ValueError, match="is merged; unmerge_lora"):
        add_lora(model, 2, 4, adapter="poems")
    with pytest.raises(ValueError, match="merged; unmerge_lora.model. before switching"):
        set_adapter(model, "default")
    unmerge_lora(model)
    with pytest.raises(ValueError, match="nothing is merged"):
        unmerge_lora(model)
