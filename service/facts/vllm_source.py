"""Names the installed vLLM registers, read from its source: importing vLLM takes seconds, reading a few files
does not. The tool-call and reasoning parsers, the model architectures, the quantization methods."""

from __future__ import annotations

import ast
import functools
import importlib.util
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class VllmNames:
    tool_parsers: frozenset[str]  # --tool-call-parser names
    reasoning_parsers: frozenset[str]  # --reasoning-parser names
    text_generation_architectures: frozenset[str]  # model classes vLLM generates text with (its own implementations)
    quantization_methods: frozenset[str]  # values of --quantization / a config's quant_method it knows
    # Every model class vLLM can load: its registry's tables, and transformers' auto classes, which vLLM's Transformers
    # backend runs where it has no implementation of its own (empty: not read)
    model_architectures: frozenset[str] = frozenset()

    @property
    def installed(self) -> bool:
        return bool(self.text_generation_architectures)


def _assignment(tree: ast.Module, name: str) -> ast.expr | None:
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            return node.value
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == name:
            return node.value
    return None


def _dict_keys(source: Path, table: str) -> frozenset[str]:
    value = _assignment(ast.parse(source.read_text()), table)
    if not isinstance(value, ast.Dict):
        return frozenset()
    return frozenset(str(k.value) for k in value.keys if isinstance(k, ast.Constant))


def _literal_values(source: Path, alias: str) -> frozenset[str]:
    """The strings of `alias = Literal["a", "b", ...]`."""
    value = _assignment(ast.parse(source.read_text()), alias)
    if not isinstance(value, ast.Subscript):
        return frozenset()
    items = value.slice.elts if isinstance(value.slice, ast.Tuple) else [value.slice]
    return frozenset(str(i.value) for i in items if isinstance(i, ast.Constant))


@functools.cache
def read_vllm_names() -> VllmNames:
    """What the installed vLLM registers (all empty if it is absent)."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return VllmNames(frozenset(), frozenset(), frozenset(), frozenset())
    root = Path(next(iter(spec.submodule_search_locations)))
    return VllmNames(
        tool_parsers=_dict_keys(root / "tool_parsers" / "__init__.py", "_TOOL_PARSERS_TO_REGISTER"),
        reasoning_parsers=_dict_keys(root / "reasoning" / "__init__.py", "_REASONING_PARSERS_TO_REGISTER"),
        text_generation_architectures=_dict_keys(
            root / "model_executor" / "models" / "registry.py", "_TEXT_GENERATION_MODELS"
        ),
        quantization_methods=_literal_values(
            root / "model_executor" / "layers" / "quantization" / "__init__.py", "QuantizationMethods"
        ),
        model_architectures=_registry_tables(root / "model_executor" / "models" / "registry.py")
        | _transformers_auto_classes(),
    )


def _registry_tables(source: Path) -> frozenset[str]:
    """The keys of every `_..._MODELS = {...}` table of vLLM's model registry."""
    tree = ast.parse(source.read_text())
    names: set[str] = set()
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        value = getattr(node, "value", None)
        if getattr(target, "id", "").endswith("_MODELS") and isinstance(value, ast.Dict):
            names |= {str(k.value) for k in value.keys if isinstance(k, ast.Constant)}
    return frozenset(names)


def _transformers_auto_classes() -> frozenset[str]:
    """The class names of transformers' auto mappings (MODEL_..._MAPPING_NAMES), from its source: importing it takes
    seconds."""
    spec = importlib.util.find_spec("transformers")
    if spec is None or not spec.submodule_search_locations:
        return frozenset()
    source = Path(next(iter(spec.submodule_search_locations))) / "models" / "auto" / "modeling_auto.py"
    if not source.is_file():
        return frozenset()
    names: set[str] = set()
    for node in ast.parse(source.read_text()).body:
        target = node.targets[0] if isinstance(node, ast.Assign) else None
        if getattr(target, "id", "").endswith("_MAPPING_NAMES"):
            names |= {c.value for c in ast.walk(node) if isinstance(c, ast.Constant) and isinstance(c.value, str)}
    return frozenset(names)
