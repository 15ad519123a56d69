"""LoRA adapter directories (the lora_adapters setting) -> what the engine needs to know of each: its rank and the
layers it changes. Read from the files PEFT saves (adapter_config.json beside adapter_model.safetensors or .bin),
as vLLM's loader reads them; no weights are loaded."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from service.facts.json_file import read_json
from service.facts.safetensors_header import read_header

# The weight files vLLM's LoRA loader looks for (vllm/lora/lora_model.py), in its order.
WEIGHT_FILES = ("adapter_model.safetensors", "adapter_model.bin", "adapter_model.pt")


@dataclass(frozen=True)
class AdapterFacts:
    name: str  # the model name requests use for it
    path: str  # absolute directory
    rank: int  # r
    alpha: float  # lora_alpha
    target_modules: tuple[str, ...]  # the layers it changes, as PEFT names them
    base_model: str | None  # base_model_name_or_path: what it was trained on (a name or a path, often another copy's)
    weights: str  # the weight file's name
    # (module, inputs) of each changed layer kind, from its lora_A tensors' shapes in the safetensors header, e.g.
    # ("q_proj", 2048)
    inputs: tuple[tuple[str, int], ...] = ()
    layers: int | None = None  # 1 + the highest decoder layer index its tensors name


_LORA_A = re.compile(r"(?:^|\.)(?P<module>[^.]+)\.lora_A(?:\.[^.]+)?\.weight$")
_LAYER = re.compile(r"\.(?:layers|h|blocks)\.(\d+)\.")


def _layer_inputs(tensors: Mapping[str, Mapping[str, Any]]) -> tuple[tuple[tuple[str, int], ...], int | None]:
    inputs = {
        (m["module"], int(entry["shape"][-1]))
        for name, entry in tensors.items()
        if (m := _LORA_A.search(name)) and entry["shape"]
    }
    layers = [int(m[1]) for name in tensors if (m := _LAYER.search(name))]
    return tuple(sorted(inputs)), (max(layers) + 1 if layers else None)


def _shapes(file: Path) -> Mapping[str, Mapping[str, Any]]:
    """Each tensor's {"shape": [...]}: a safetensors header, or a torch pickle (.bin / .pt) opened on the meta device,
    which reads the pickle's metadata and no tensor data (adapters are small either way)."""
    if file.suffix == ".safetensors":
        return read_header(file)
    import pickle

    import torch

    try:
        state = torch.load(file, map_location="meta", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise ValueError(f"{file.name} is no readable torch file ({type(exc).__name__}: {first})") from exc
    if not isinstance(state, dict):
        raise ValueError(f"{file.name} holds a {type(state).__name__}, not a dict of tensors")
    return {str(k): {"shape": list(v.shape)} for k, v in state.items() if isinstance(v, torch.Tensor)}


def read_adapter(name: str, directory: Path) -> AdapterFacts:
    """One adapter; ValueError names what keeps it from being served."""
    where = f"LoRA adapter {name!r} ({directory})"
    try:
        is_dir = directory.is_dir()
    except OSError as exc:  # a name too long for the filesystem, a directory without permission
        raise ValueError(f"{where} cannot be read: {exc.strerror or exc}") from exc
    if not is_dir:
        raise ValueError(f"{where} is not a directory")
    config_file = directory / "adapter_config.json"
    if not config_file.is_file():
        raise ValueError(f"{where} has no adapter_config.json: not a PEFT adapter directory")
    try:
        config = read_json(config_file)
    except (ValueError, OSError) as exc:
        raise ValueError(f"{where}: {exc}") from exc
    if not isinstance(config, dict):
        raise ValueError(f"{where}: adapter_config.json holds no JSON object")
    peft_type = str(config.get("peft_type", "LORA")).upper()
    if peft_type != "LORA":
        raise ValueError(f"{where} is a {peft_type} adapter: vLLM serves LoRA adapters only")
    rank = config.get("r")
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise ValueError(f"{where}: adapter_config.json gives no rank r (a positive integer), but {rank!r}")
    weights = next((f for f in WEIGHT_FILES if (directory / f).is_file()), None)
    if weights is None:
        raise ValueError(f"{where} holds none of {', '.join(WEIGHT_FILES)}")
    targets = config.get("target_modules") or ()
    inputs: tuple[tuple[str, int], ...] = ()
    layers = None
    try:
        inputs, layers = _layer_inputs(_shapes(directory / weights))
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from exc
    except (KeyError, TypeError, IndexError) as exc:  # a header entry without a shape list
        raise ValueError(f"{where}: {weights} gives no shape for its tensors ({type(exc).__name__}: {exc})") from exc
    return AdapterFacts(
        name=name,
        path=str(directory.absolute()),
        rank=rank,
        alpha=float(config.get("lora_alpha", rank)),
        target_modules=(targets,) if isinstance(targets, str) else tuple(sorted(str(t) for t in targets)),
        base_model=str(config["base_model_name_or_path"]) if config.get("base_model_name_or_path") else None,
        weights=weights,
        inputs=inputs,
        layers=layers,
    )


def read_adapters(adapters: Mapping[str, Path]) -> tuple[AdapterFacts, ...]:
    return tuple(read_adapter(name, Path(path).expanduser()) for name, path in adapters.items())
