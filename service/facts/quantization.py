"""config.json `quantization_config` -> what a linear kernel needs to know: format, bits, groups, act-order,
activation scheme, symmetry, and the shapes of the linear layers it will run (without loading weights)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

Config = Mapping[str, Any]


@dataclass(frozen=True)
class LinearShape:
    name: str  # the layer as vLLM runs it: qkv_proj, o_proj, gate_up_proj, down_proj
    in_features: int  # K
    out_features: int  # N (fused layers: the sum of their parts)


@dataclass(frozen=True)
class QuantFacts:
    method: str  # quant_method: "compressed-tensors", "gptq", "awq", "fp8", ...
    format: str | None  # compressed-tensors: "int-quantized", "pack-quantized", "float-quantized", ...
    weight_type: str  # "int" | "float"
    weight_bits: int | None
    weight_strategy: str | None  # "channel" | "group" | "tensor" | "block"
    group_size: int | None  # None: one scale per output channel (or per tensor)
    weight_symmetric: bool
    act_order: str | None  # None, or how input channels were reordered: "static"/"weight" (folded into the
    # weights, no g_idx at run time), "group"/"dynamic" (CT g_idx), "desc_act" (GPTQ g_idx)
    activation_bits: int  # 16 when activations stay in floating point
    activation_scheme: str | None  # "dynamic" (scales computed per call) | "static" (scales in the checkpoint)
    activation_strategy: str | None  # "token" | "tensor" | "group"
    activation_symmetric: bool | None
    ignore: tuple[str, ...]  # layers left unquantized (names or "re:" patterns)
    linear_shapes: tuple[LinearShape, ...]  # quantized decoder linear layers (dense Llama-style models)

    @property
    def scheme(self) -> str:
        """The scheme as checkpoints name it: the method with bits ("gptq-w4a16", "compressed-tensors-w8a8"), "fp8",
        or the method alone where its bits are not known."""
        if self.method == "fp8" or self.weight_bits is None:
            return self.method
        if self.weight_type == "float":
            return f"{self.method}-fp{self.weight_bits}"
        if self.method in ("gptq", "awq"):
            return self.key
        return f"{self.method}-{self.key}"

    @property
    def key(self) -> str:
        """The family the kernel table is keyed on."""
        if self.weight_type == "float":
            return "fp8" if self.weight_bits == 8 else f"fp{self.weight_bits}"
        if self.method in ("gptq", "awq"):
            return f"{self.method}-w{self.weight_bits}a16"
        return f"w{self.weight_bits}a{self.activation_bits}"


def _first_group(q: Config) -> Config:
    return next(iter((q.get("config_groups") or {}).values()), {}) or {}


def _bits(args: Config | None) -> int:
    return int(args["num_bits"]) if args and args.get("num_bits") else 16


def _compressed_tensors(q: Config) -> dict[str, Any]:
    group = _first_group(q)
    w = group.get("weights") or {}
    a = group.get("input_activations") or None
    strategy = w.get("strategy")
    return dict(
        format=group.get("format") or q.get("format"),
        weight_type=w.get("type") or "int",
        weight_bits=_bits(w),
        weight_strategy=strategy,
        group_size=int(w["group_size"]) if strategy == "group" and w.get("group_size") else None,
        weight_symmetric=bool(w.get("symmetric", True)),
        act_order=w.get("actorder") or None,
        activation_bits=_bits(a),
        activation_scheme=None if a is None else ("dynamic" if a.get("dynamic") else "static"),
        activation_strategy=None if a is None else a.get("strategy"),
        activation_symmetric=None if a is None else bool(a.get("symmetric", True)),
        ignore=tuple(q.get("ignore") or ()),
    )


def _gptq(q: Config) -> dict[str, Any]:
    group = int(q.get("group_size", -1))
    return dict(
        format="gptq",
        weight_type="int",
        weight_bits=int(q.get("bits", 4)),
        weight_strategy="channel" if group == -1 else "group",
        group_size=None if group == -1 else group,
        weight_symmetric=bool(q.get("sym", True)),
        act_order="desc_act" if q.get("desc_act") else None,
        ignore=(),
    )


def _awq(q: Config) -> dict[str, Any]:
    group = int(q.get("group_size") or q.get("q_group_size") or -1)
    return dict(
        format="awq",
        weight_type="int",
        weight_bits=int(q.get("bits") or q.get("w_bit") or 4),
        weight_strategy="channel" if group == -1 else "group",
        group_size=None if group == -1 else group,
        weight_symmetric=not q.get("zero_point", True),
        act_order=None,
        ignore=tuple(q.get("modules_to_not_convert") or ()),
    )


def _fp8(q: Config) -> dict[str, Any]:
    block = q.get("weight_block_size")
    return dict(
        format="fp8",
        weight_type="float",
        weight_bits=8,
        weight_strategy="block" if block else "tensor",
        group_size=None,
        weight_symmetric=True,
        act_order=None,
        activation_bits=8,
        activation_scheme=q.get("activation_scheme") or "dynamic",
        activation_strategy="tensor",
        activation_symmetric=True,
        ignore=tuple(q.get("ignored_layers") or ()),
    )


_READERS = {"compressed-tensors": _compressed_tensors, "gptq": _gptq, "awq": _awq, "fp8": _fp8}


# (vLLM layer, its parts in the checkpoint, K, N) for dense Llama-style decoders.
def dense_layers(lm: Config) -> list[tuple[str, tuple[str, ...], int, int]]:
    """The decoder's linear layers as vLLM fuses them: (name, checkpoint parts, K, N); none for MoE models."""
    hidden, inter = lm.get("hidden_size"), lm.get("intermediate_size")
    heads = lm.get("num_attention_heads")
    if not (hidden and inter and heads) or lm.get("num_experts") or lm.get("n_routed_experts"):
        return []
    kv = lm.get("num_key_value_heads") or heads
    head_dim = lm.get("head_dim") or hidden // heads
    return [
        ("qkv_proj", ("q_proj", "k_proj", "v_proj"), hidden, (heads + 2 * kv) * head_dim),
        ("o_proj", ("o_proj",), heads * head_dim, hidden),
        ("gate_up_proj", ("gate_proj", "up_proj"), hidden, 2 * inter),
        ("down_proj", ("down_proj",), inter, hidden),
    ]


def _ignored(part: str, ignore: tuple[str, ...]) -> bool:
    """A projection counts as unquantized when the ignore list names it (in any layer) or a pattern matches it."""
    probe = f"model.layers.0.x.{part}"
    for entry in ignore:
        if entry.startswith("re:"):
            if re.match(entry[3:], probe):
                return True
        elif entry == part or entry.endswith("." + part):
            return True
    return False


def read_quantization(lm: Config) -> QuantFacts | None:
    """Quantization facts of a (language-model) config, None for an unquantized model."""
    q = lm.get("quantization_config") or lm.get("compression_config")
    if not isinstance(q, Mapping) or not q.get("quant_method"):
        return None
    method = str(q["quant_method"]).lower()
    reader = _READERS.get(method)
    fields: dict[str, Any] = dict(
        format=None,
        weight_type="int",
        weight_bits=q.get("bits"),
        weight_strategy=None,
        group_size=None,
        weight_symmetric=True,
        act_order=None,
        ignore=(),
    )
    if reader:
        fields.update(reader(q))
    fields.setdefault("activation_bits", 16)
    for name in ("activation_scheme", "activation_strategy", "activation_symmetric"):
        fields.setdefault(name, None)
    shapes = tuple(
        LinearShape(name, k, n)
        for name, parts, k, n in dense_layers(lm)
        if not any(_ignored(p, fields["ignore"]) for p in parts)
    )
    return QuantFacts(method=method, linear_shapes=shapes, **fields)
