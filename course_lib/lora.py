"""LoRA built by hand (lesson 15): low-rank adapters on a frozen GPT, merged and unmerged.

Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models", eq. (3): a frozen weight
``W (d_out, d_in)`` learns only a low-rank update ``ΔW = B A``, with ``B (d_out, r)`` and
``A (r, d_in)``, ``r << min(d_in, d_out)``:

    h = W x + b + (α / r) · B A dropout(x)          (rsLoRA, Kalajdzievski 2023: α / √r)

``B`` starts at zero, so the wrapped model computes exactly what it did before training; ``A`` starts
as PEFT initialises it (``nn.init.kaiming_uniform_(A, a=√5)``, ``nn.Linear``'s own default, peft
0.21.2's ``LoraLayer.reset_lora_parameters``). The names are PEFT's (``LoraLayer``): ``base_layer``,
``lora_A``, ``lora_B``, ``lora_dropout``, ``scaling``, ``merge()``, ``unmerge()``,
``get_delta_weight()``, ``merge_and_unload``.

Several adapters on one base (PEFT's shape): every ``LoRALinear`` keeps its adapters by name, one of
them active. ``add_lora(model, ..., adapter="poems")`` adds an adapter (wrapping the targeted layers
the first time), ``set_adapter(model, name)`` switches; only the active adapter's ``A`` and ``B``
are trainable, every other parameter is frozen. The base weights exist once, whatever the number
of adapters: N adapters cost N · (trainable parameters), not N copies of the model.

Targets are the names of course_lib's GPT (``q_proj``, ``k_proj``, ``v_proj``, ``out_proj``,
``linear1``, ``linear2``; lesson 11's SwiGLU adds ``gate`` and ``up``), or PEFT's names for
Hugging Face's GPT-2, which ``course_lib.gpt.load_into_hf_gpt2`` ports the same model into:
``c_attn`` (q, k, v stored as one fused ``Conv1D``: ONE ``A`` shared by q, k and v, each with its own
rows of ``B``, which is exactly PEFT's ``B A`` on the fused weight), ``c_proj`` (``out_proj`` and
``linear2``, as PEFT's suffix match takes both) and ``c_fc`` (``linear1``). One difference remains,
with LoRA dropout in train mode only: q, k and v each draw their own dropout mask, where PEFT's fused
layer draws one.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["LoRALinear", "TARGETS", "PEFT_GPT2_TARGETS", "add_lora", "set_adapter", "lora_layers",
           "lora_parameters", "trainable_parameters", "merge_lora", "unmerge_lora", "merge_and_unload"]

# course_lib's names of the projections inside a GPT block (attention, feed-forward, SwiGLU).
TARGETS = ("q_proj", "k_proj", "v_proj", "out_proj", "linear1", "linear2", "gate", "up")
# PEFT's names for GPT2LMHeadModel's Conv1D layers -> course_lib's layers they stand for.
PEFT_GPT2_TARGETS = {"c_attn": ("q_proj", "k_proj", "v_proj"), "c_proj": ("out_proj", "linear2"),
                     "c_fc": ("linear1",)}
DEFAULT_TARGET = ("q_proj", "k_proj", "v_proj", "out_proj", "linear1", "linear2")


def _check_hyper(r, alpha, dropout, rslora, where: str) -> None:
    """r an int >= 1, alpha a finite number > 0, dropout in [0, 1), rslora a bool."""
    if isinstance(r, bool) or not isinstance(r, int) or r < 1:
        raise ValueError(f"{where}: r (the rank) must be an int >= 1, got {r!r}")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not (math.isfinite(alpha)
                                                                                and alpha > 0):
        raise ValueError(f"{where}: alpha must be a finite number > 0, got {alpha!r}")
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout < 1:
        raise ValueError(f"{where}: dropout must be a number in [0, 1), got {dropout!r}")
    if not isinstance(rslora, bool):
        raise TypeError(f"{where}: rslora must be True or False, got {rslora!r}")


def _check_name(name, where: str) -> None:
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"{where}: an adapter's name must be a Python identifier such as 'poems', "
                         f"got {name!r}")


class LoRALinear(nn.Module):
    """``base (d_in -> d_out)`` frozen, plus ``scaling · B A dropout(x)`` of the active adapter.

    ``forward(x (..., d_in)) -> (..., d_out)``: ``base_layer(x) + (lora_B @ (lora_A @ dropout(x)))
    * scaling``, with ``lora_A[name] (r, d_in)``, ``lora_B[name] (d_out, r)`` and ``scaling =
    alpha / r`` (``alpha / sqrt(r)`` with ``rslora``). Merged (``merge()``), ``B A · scaling`` has
    been added to ``base_layer.weight`` and the forward pass is ``base_layer(x)`` alone: the same
    function, without the extra matmuls. Dropout belongs to the unmerged path only: a merged layer
    cannot drop parts of ``x`` inside ``B A``, so in train mode with ``dropout > 0`` merging changes
    the output (it computes what the unmerged layer computes in eval mode, the dropout's mean).

    ``lora_A``: optional, an existing ``(r, d_in)`` parameter to share (``c_attn``: q, k and v share
    one ``A``, as PEFT's fused layer does). ``adapter``: the first adapter's name.
    """

    def __init__(self, base: nn.Linear, r: int, alpha: float, dropout: float = 0.0,
                 rslora: bool = False, adapter: str = "default",
                 lora_A: nn.Parameter | None = None) -> None:
        super().__init__()
        if isinstance(base, LoRALinear):
            raise TypeError("LoRALinear: this layer is already a LoRALinear; add another adapter "
                            "with its add_adapter(name, r, alpha), not a second wrapper")
        if not isinstance(base, nn.Linear):
            raise TypeError(f"LoRALinear: base must be an nn.Linear, got {type(base).__name__}")
        self.base_layer = base
        self.in_features, self.out_features = base.in_features, base.out_features
        self.lora_A = nn.ParameterDict()  # name -> (r, d_in)
        self.lora_B = nn.ParameterDict()  # name -> (d_out, r)
        self.lora_dropout = nn.ModuleDict()  # name -> nn.Dropout or nn.Identity
        self.r: dict[str, int] = {}
        self.lora_alpha: dict[str, float] = {}
        self.scaling: dict[str, float] = {}
        self.active_adapter = adapter
        self.merged_adapter: str | None = None  # the adapter whose B A is inside base_layer.weight
        self.add_adapter(adapter, r, alpha, dropout, rslora, lora_A)

    @property
    def merged(self) -> bool:
        return self.merged_adapter is not None

    @property
    def weight(self) -> torch.Tensor:
        """The base layer's ``(d_out, d_in)`` weight (with ``B A`` inside it when merged)."""
        return self.base_layer.weight

    @property
    def bias(self) -> torch.Tensor | None:
        return self.base_layer.bias

    @property
    def A(self) -> nn.Parameter:
        """The active adapter's ``(r, d_in)`` matrix."""
        return self.lora_A[self.active_adapter]

    @property
    def B(self) -> nn.Parameter:
        """The active adapter's ``(d_out, r)`` matrix."""
        return self.lora_B[self.active_adapter]

    def add_adapter(self, name: str, r: int, alpha: float, dropout: float = 0.0, rslora: bool = False,
                    lora_A: nn.Parameter | None = None) -> None:
        """A new adapter: ``A`` kaiming-uniform (a=√5) or the shared ``lora_A``, ``B`` zero. It
        does not become active (``set_adapter``) unless it is the layer's first."""
        _check_name(name, "LoRALinear.add_adapter")
        _check_hyper(r, alpha, dropout, rslora, "LoRALinear")
        if name in self.lora_A:
            raise ValueError(f"LoRALinear.add_adapter: this layer already has an adapter {name!r}")
        if self.merged:
            raise ValueError("LoRALinear.add_adapter: the layer is merged; unmerge() it first")
        w = self.base_layer.weight
        if lora_A is None:
            lora_A = nn.Parameter(torch.empty(r, self.in_features, dtype=w.dtype, device=w.device))
            nn.init.kaiming_uniform_(lora_A, a=math.sqrt(5))  # PEFT's init_lora_weights=True
        elif not isinstance(lora_A, nn.Parameter) or lora_A.shape != (r, self.in_features):
            raise ValueError(f"LoRALinear: a shared lora_A must be an nn.Parameter of shape "
                             f"({r}, {self.in_features}), got {type(lora_A).__name__} "
                             f"{tuple(getattr(lora_A, 'shape', ()))}")
        self.lora_A[name] = lora_A
        self.lora_B[name] = nn.Parameter(torch.zeros(self.out_features, r, dtype=w.dtype,
                                                     device=w.device))  # B = 0: no change at first
        self.lora_dropout[name] = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.r[name], self.lora_alpha[name] = r, alpha
        self.scaling[name] = alpha / math.sqrt(r) if rslora else alpha / r

    def get_delta_weight(self, adapter: str | None = None) -> torch.Tensor:
        """``ΔW = (B @ A) · scaling``, ``(d_out, d_in)``: what merging adds to the weight."""
        name = self.active_adapter if adapter is None else adapter
        if name not in self.lora_A:
            raise ValueError(f"LoRALinear: no adapter {name!r}; this layer has {list(self.lora_A)}")
        return (self.lora_B[name] @ self.lora_A[name]) * self.scaling[name]  # (d_out, r) @ (r, d_in)

    @torch.no_grad()
    def merge(self) -> None:
        """``W <- W + ΔW`` of the active adapter; the forward pass is then ``base_layer`` alone."""
        if self.merged:
            raise ValueError(f"LoRALinear.merge: adapter {self.merged_adapter!r} is already merged; "
                             "merging twice would add B A twice (unmerge() first)")
        if self.active_adapter not in self.lora_A:
            raise ValueError(f"LoRALinear.merge: this layer has no adapter {self.active_adapter!r}")
        self.base_layer.weight += self.get_delta_weight().to(self.base_layer.weight.dtype)
        self.merged_adapter = self.active_adapter

    @torch.no_grad()
    def unmerge(self) -> None:
        """``W <- W - ΔW``: the weight before ``merge()``, to within one rounding of ``W + ΔW``
        (the same ``ΔW`` is added and subtracted, so the error is at most ``eps · |W + ΔW|``)."""
        if not self.merged:
            raise ValueError("LoRALinear.unmerge: nothing is merged")
        self.base_layer.weight -= self.get_delta_weight(self.merged_adapter).to(
            self.base_layer.weight.dtype)
        self.merged_adapter = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not isinstance(x, torch.Tensor) or x.dim() == 0 or x.size(-1) != self.in_features:
            got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"LoRALinear: x must be (..., d_in={self.in_features}), got {got}")
        result = self.base_layer(x)  # (..., d_out): W x + b
        name = self.active_adapter
        if self.merged or name not in self.lora_A:  # merged: B A is already inside W
            return result
        dropped = self.lora_dropout[name](x)  # (..., d_in)
        return result + F.linear(F.linear(dropped, self.lora_A[name]), self.lora_B[name]) * self.scaling[name]

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, adapters="
                f"{ {n: self.r[n] for n in self.r} }, active={self.active_adapter!r}, merged={self.merged}")


def _resolve_targets(target) -> tuple[tuple[str, ...], bool]:
    """``target`` -> (course_lib names, whether q/k/v share one A as PEFT's ``c_attn``)."""
    if isinstance(target, str):
        target = (target,)
    if not isinstance(target, (tuple, list, set)) or not target:
        raise TypeError(f"add_lora: target must be a name or a non-empty list of names, got {target!r}")
    names, shared = [], False
    for t in target:
        if t in PEFT_GPT2_TARGETS:
            names += PEFT_GPT2_TARGETS[t]
            shared = shared or t == "c_attn"
        elif t in TARGETS:
            names.append(t)
        else:
            raise ValueError(f"add_lora: unknown target {t!r}; course_lib's projections are {TARGETS} "
                             f"and PEFT's GPT-2 names {tuple(PEFT_GPT2_TARGETS)}")
    if shared and any(t in target for t in ("q_proj", "k_proj", "v_proj")):
        raise ValueError("add_lora: 'c_attn' already means q_proj, k_proj and v_proj with one shared "
                         "A; give either 'c_attn' or the separate names, not both")
    return tuple(dict.fromkeys(names)), shared


def lora_layers(model: nn.Module) -> dict[str, LoRALinear]:
    """Every ``LoRALinear`` inside ``model``, by its module name (``blocks.layers.0.self_attn.q_proj``)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"lora_layers: model must be an nn.Module, got {type(model).__name__}")
    return {name: m for name, m in model.named_modules() if isinstance(m, LoRALinear)}


def _adapters(model: nn.Module) -> set[str]:
    return {name for layer in lora_layers(model).values() for name in layer.lora_A}


def _freeze_all_but(model: nn.Module, adapter: str) -> None:
    """Only ``adapter``'s A and B train; everything else (embeddings, norms, W, b) is frozen."""
    for p in model.parameters():
        p.requires_grad_(False)
    for layer in lora_layers(model).values():
        if adapter in layer.lora_A:
            layer.lora_A[adapter].requires_grad_(True)
            layer.lora_B[adapter].requires_grad_(True)


def add_lora(model: nn.Module, r: int, alpha: float, target=DEFAULT_TARGET, dropout: float = 0.0,
             rslora: bool = False, adapter: str = "default") -> nn.Module:
    """Wrap ``model``'s projections named in ``target`` in ``LoRALinear`` (in place) with a new
    adapter of rank ``r``, make it the active one and freeze every other parameter; returns
    ``model``. Call it again with another ``adapter`` name for a second adapter on the same base
    (layers wrapped before get the new adapter; new targets are wrapped). See the module's docstring
    for the target names (``"c_attn"``: q, k and v share one ``A``, as PEFT on GPT-2)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"add_lora: model must be an nn.Module, got {type(model).__name__}")
    _check_name(adapter, "add_lora")
    _check_hyper(r, alpha, dropout, rslora, "add_lora")
    names, shared = _resolve_targets(target)
    if adapter in _adapters(model):
        raise ValueError(f"add_lora: the model already has an adapter {adapter!r}; choose a new name "
                         "(set_adapter switches between existing ones)")
    if any(layer.merged for layer in lora_layers(model).values()):
        raise ValueError("add_lora: the model is merged; unmerge_lora(model) first")
    found = 0
    for parent in list(model.modules()):
        if isinstance(parent, LoRALinear):
            continue
        shared_A = None
        for child_name in names:  # q, k, v first: the order of PEFT_GPT2_TARGETS["c_attn"]
            child = getattr(parent, child_name, None)
            if not isinstance(child, (nn.Linear, LoRALinear)):
                continue
            share = shared_A if shared and child_name in ("k_proj", "v_proj") else None
            if isinstance(child, LoRALinear):
                child.add_adapter(adapter, r, alpha, dropout, rslora, share)
            else:
                child = LoRALinear(child, r, alpha, dropout, rslora, adapter, share)
                setattr(parent, child_name, child)
            if shared and child_name == "q_proj":
                shared_A = child.lora_A[adapter]
            found += 1
    if not found:
        raise ValueError(f"add_lora: the model has no nn.Linear called {names}; course_lib's GPT "
                         f"names its projections {DEFAULT_TARGET}")
    return set_adapter(model, adapter)


def set_adapter(model: nn.Module, adapter: str) -> nn.Module:
    """Make ``adapter`` the active one in every ``LoRALinear`` (a layer without it computes its base
    alone) and the only trainable parameters; returns ``model``."""
    known = _adapters(model)
    if adapter not in known:
        raise ValueError(f"set_adapter: no adapter {adapter!r}; the model has {sorted(known)}")
    layers = lora_layers(model).values()
    if any(layer.merged for layer in layers):
        raise ValueError("set_adapter: the model is merged; unmerge_lora(model) before switching")
    for layer in layers:
        layer.active_adapter = adapter
    _freeze_all_but(model, adapter)
    return model


def lora_parameters(model: nn.Module, adapter: str | None = None) -> list[nn.Parameter]:
    """The ``A`` and ``B`` of ``adapter`` (default: the active one), each once (a shared ``A``
    counts once), in module order: what the optimizer of a LoRA fine-tuning gets."""
    layers = lora_layers(model)
    if not layers:
        raise ValueError("lora_parameters: the model has no LoRALinear; call add_lora(model, r, alpha)")
    name = adapter if adapter is not None else next(iter(layers.values())).active_adapter
    if name not in _adapters(model):
        raise ValueError(f"lora_parameters: no adapter {name!r}; the model has {sorted(_adapters(model))}")
    params, seen = [], set()
    for layer in layers.values():
        for p in (layer.lora_A.get(name), layer.lora_B.get(name)):
            if p is not None and id(p) not in seen:
                seen.add(id(p))
                params.append(p)
    return params


def trainable_parameters(model: nn.Module) -> int:
    """How many numbers the optimizer updates (``requires_grad``), a tied or shared tensor once."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def merge_lora(model: nn.Module) -> nn.Module:
    """Merge the active adapter into every ``LoRALinear``'s weight (``W <- W + ΔW``); returns
    ``model``. A merged model computes the same logits with no extra matmuls (in eval mode; LoRA's
    dropout has no merged form). Merging an already merged model is an error."""
    layers = lora_layers(model)
    if not layers:
        raise ValueError("merge_lora: the model has no LoRALinear; call add_lora first")
    if any(layer.merged for layer in layers.values()):
        raise ValueError("merge_lora: the model is already merged; merging twice adds B A twice")
    for layer in layers.values():
        if layer.active_adapter in layer.lora_A:
            layer.merge()
    return model


def unmerge_lora(model: nn.Module) -> nn.Module:
    """Subtract every merged ``ΔW`` again (``W <- W - ΔW``); returns ``model``."""
    layers = [layer for layer in lora_layers(model).values() if layer.merged]
    if not layers:
        raise ValueError("unmerge_lora: nothing is merged")
    for layer in layers:
        layer.unmerge()
    return model


def merge_and_unload(model: nn.Module) -> nn.Module:
    """PEFT's ``merge_and_unload``: merge the active adapter and put each merged ``base_layer``
    (a plain ``nn.Linear``) back in place of its ``LoRALinear``; every other adapter is dropped.
    Returns ``model``, whose weights then port to Hugging Face again (``load_into_hf_gpt2``)."""
    if not any(layer.merged for layer in lora_layers(model).values()):
        merge_lora(model)
    for name, layer in lora_layers(model).items():
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, layer.base_layer)
    return model
