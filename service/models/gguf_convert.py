"""Carries out the policy's GGUF conversion (service/policy/gguf/model_source.py): the file's tensors dequantized one at a
time into safetensors shards in the engine dtype (or, where the plan keeps them, the linear layers' and the LM head's
blocks copied as stored, for service/kernels/gguf_blocks.py), its metadata written as a Hugging Face config and tokenizer.

transformers does the mapping (`load_gguf_checkpoint` for the config, its per-architecture tensor processors and
gguf-py's name map for the tensors, its GGUF tokenizer builders), gguf-py the dequantization. Memory stays near one
shard. The copy is built once, atomically (service/cache/atomic_dir.py): a start that is interrupted leaves no directory a
later start would load, and the next conversion clears its leftovers.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

from service.cache.atomic_dir import build_once, finished_problem
from service.facts.gguf import LINEAR_TENSOR
from service.facts.gguf_reader import shared_readers
from service.kernels.registry import BLOCKS_METHOD
from service.policy.gguf.model_source import GgufConversion

log = logging.getLogger("service.gguf")

SHARD_BYTES = 2 * 1024**3
PROGRESS_EVERY_S = 5.0
PROVENANCE = "conversion.json"

_DTYPES = {"bfloat16": "bfloat16", "float16": "float16", "float32": "float32"}


class ConversionError(RuntimeError):
    pass


def ensure_converted(conversion: GgufConversion) -> Path:
    """The converted model directory, converting first when it is not in the cache yet."""
    target = Path(conversion.target)
    if finished_problem(target, PROVENANCE) is None:  # every file at the size its conversion wrote
        log.info("GGUF %s: using the converted copy at %s", conversion.source, target)
        return target
    started = time.monotonic()
    log.info(
        "GGUF %s: converting to %s at %s (once; later starts reuse it)", conversion.source, conversion.dtype, target
    )
    try:
        built = build_once(target, lambda staging: _convert(conversion, staging), complete=PROVENANCE)
    except Exception as exc:
        raise ConversionError(f"converting {conversion.source} failed: {exc}") from exc
    if built:
        log.info("GGUF %s: converted in %.1f s", conversion.source, time.monotonic() - started)
    else:
        log.info("GGUF %s: using the copy another start converted at %s", conversion.source, target)
    return target


def _convert(conversion: GgufConversion, out: Path) -> None:
    from transformers import AutoConfig

    _check_free_space(conversion, out)
    with shared_readers():  # the tokenizer builder and the tensor copy read the same header
        # Tokenizer first: the cheap part, and the one most likely to refuse a file.
        tokenizer_of(conversion).save_pretrained(out)
        settings = {k: v for k, v in conversion.config.items() if k != "model_type"}
        config = AutoConfig.for_model(conversion.config["model_type"], **settings)
        config.dtype = _DTYPES[conversion.dtype]
        written = _write_weights(conversion, config, out)
    config.save_pretrained(out)
    provenance = {
        "source": conversion.source,
        "sha256": conversion.sha256,
        "dtype": conversion.dtype,
        "blocks": conversion.blocks,
        "converter": conversion.converter,
        "tensors": written,
    }
    (out / PROVENANCE).write_text(json.dumps(provenance, indent=2))


def _check_free_space(conversion: GgufConversion, out: Path) -> None:
    """A copy that cannot fit is refused before the minutes its conversion takes (a 40 GB file: many), not at the
    write that fails. Checked once the leftovers of killed conversions are cleared, whose space counts as free."""
    free = shutil.disk_usage(out).free
    if free < conversion.weight_bytes:
        raise ConversionError(
            f"the converted copy needs about {conversion.weight_bytes / 1e6:,.0f} MB in {out.parent}, which has "
            f"{free / 1e6:,.0f} MB free: free some space there, or set cache_dir to a larger disk"
        )


def tokenizer_of(conversion: GgufConversion) -> Any:
    """transformers' tokenizer from the file's metadata, splitting text as llama.cpp does where transformers has no
    rule for the file's pre-tokenizer (service/facts/gguf.py LLAMA_CPP_SPLITS), and with a BOS before a text where
    llama.cpp puts one (transformers reads only the file's key; llama.cpp defaults by vocabulary: a SentencePiece
    file without the key lost its BOS)."""
    from tokenizers import Regex, pre_tokenizers
    from transformers import AutoTokenizer

    source = Path(conversion.source)
    tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    if conversion.split_rules:
        tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(rule), behavior="isolated") for rule in conversion.split_rules]
            + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
        )
    if tokenizer.add_bos_token != conversion.adds_bos:
        tokenizer.add_bos_token = conversion.adds_bos  # its setter rebuilds the post-processor
    return tokenizer


def _write_weights(conversion: GgufConversion, config: Any, out: Path) -> int:
    import numpy as np
    import torch
    from gguf import GGUFReader
    from gguf.quants import dequantize
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

    source = Path(conversion.source)
    dtype = getattr(torch, conversion.dtype)
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    config.architectures = [type(skeleton).__name__]
    shapes = {name: tuple(t.shape) for name, t in skeleton.state_dict().items()}
    expected = set(shapes) - ({"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set())
    reader = GGUFReader(source)
    processor = TENSOR_PROCESSORS.get(conversion.architecture, TensorProcessor)(config=conversion.config)
    names = weights_map(skeleton, processor)
    stash: dict[str, Any] = {"tensors": {}}  # where transformers' MoE processors assemble expert tensors
    kept: dict[str, str] = {}  # module -> ggml type of the blocks it keeps
    shards = _ShardWriter(out, save_file)
    total = sum(int(t.n_bytes) for t in reader.tensors)
    done, last_log, skipped = 0, time.monotonic(), []
    for tensor in reader.tensors:
        if conversion.blocks and (LINEAR_TENSOR.fullmatch(tensor.name) or tensor.name in conversion.heads):
            allowed = conversion.blocks if LINEAR_TENSOR.fullmatch(tensor.name) else tensor.tensor_type.name
            name, rows = _block_rows(tensor, allowed, processor, names, stash)
            shards.add(names[name], torch.from_numpy(rows))
            kept[names[name].removesuffix(".weight")] = tensor.tensor_type.name
            done += int(tensor.n_bytes)
            continue
        values = dequantize(tensor.data, tensor.tensor_type)
        result = processor.process(weights=values, name=tensor.name, tensor_key_mapping=names, parsed_parameters=stash)
        if result.name is not None and result.name in names:
            value = torch.from_numpy(np.require(result.weights, requirements=("C", "W"))).to(dtype)
            shards.add(names[result.name], _unit_dims_as(value, shapes.get(names[result.name])))
        elif result.name is not None:
            skipped.append(tensor.name)
        done += int(tensor.n_bytes)
        if time.monotonic() - last_log > PROGRESS_EVERY_S:
            log.info("GGUF %s: converted %.0f%% (%s)", source.name, 100 * done / total, tensor.name)
            last_log = time.monotonic()
    for name, value in stash["tensors"].items():
        _check_shape(name, tuple(value.shape), shapes[name])
        shards.add(name, value.to(dtype))
    shards.close()
    if skipped:
        log.info("GGUF %s: tensors the model does not use, left out: %s", source.name, ", ".join(skipped))
    missing = expected - shards.names
    if missing:
        raise ConversionError(f"the file lacks tensors the model needs: {', '.join(sorted(missing)[:8])}")
    if conversion.blocks:
        if "model.embed_tokens" in kept and getattr(config, "tie_word_embeddings", False):
            kept["lm_head"] = kept["model.embed_tokens"]  # the head vLLM ties to the embedding reads its blocks
        config.quantization_config = {"quant_method": BLOCKS_METHOD, "ggml_type": conversion.blocks, "types": kept}
    return len(shards.names)


def weights_map(skeleton: Any, processor: Any) -> dict[str, str]:
    """The file's tensor names -> the model's, from transformers. It builds gguf-py's name map anew in every submodule
    it recurses into, and the map's size grows with the layers: quadratic, 50 s for an 80-layer Llama on a Zen 4
    (`python -m bench.tools.gguf_names`). The map depends only on (architecture, layers), so one is built per conversion."""
    import gguf
    from transformers.modeling_gguf_pytorch_utils import get_gguf_hf_weights_map

    build = gguf.get_tensor_name_map
    gguf.get_tensor_name_map = functools.cache(build)  # transformers imports it from gguf at each call
    try:
        return get_gguf_hf_weights_map(skeleton, processor)
    finally:
        gguf.get_tensor_name_map = build


def _block_rows(tensor: Any, kept: str, processor: Any, names: dict[str, str], stash: Any) -> tuple[str, Any]:
    """A linear (or head) tensor's rows of blocks, as stored, in the order transformers gives the dequantized rows
    (llama's Q/K rows are un-permuted): the processor is run on the row numbers, so its reordering is the one applied.
    `kept`: the types the plan keeps for it, "+"-joined."""
    import numpy as np

    if tensor.tensor_type.name not in kept.split("+"):
        raise ConversionError(f"{tensor.name} is {tensor.tensor_type.name}; the plan kept {kept} blocks")
    n = int(np.prod(tensor.shape[1:]))  # gguf shapes list the input dimension first
    rows = np.asarray(tensor.data, dtype=np.uint8).reshape(n, -1)
    index = np.arange(n, dtype=np.int64).reshape(n, 1)
    result = processor.process(weights=index, name=tensor.name, tensor_key_mapping=names, parsed_parameters=stash)
    order = np.asarray(result.weights).reshape(-1)
    if result.name not in names or order.shape != (n,) or not np.array_equal(np.sort(order), np.arange(n)):
        raise ConversionError(f"{tensor.name}: transformers' mapping does more than reorder its rows")
    return result.name, np.ascontiguousarray(rows[order])


def _unit_dims_as(value: Any, shape: tuple[int, ...] | None) -> Any:
    """`value` in the model's shape where the two differ only by dimensions of 1: Qwen2-MoE's shared-expert gate,
    one row in the file, came out of transformers' mapping as [1, 1, hidden] for a [1, hidden] weight."""
    if shape is None or tuple(value.shape) == shape:
        return value
    if [d for d in value.shape if d != 1] == [d for d in shape if d != 1]:
        return value.reshape(shape)
    return value


def _check_shape(name: str, found: tuple[int, ...], expected: tuple[int, ...]) -> None:
    """A config that does not describe the file's tensors would only fail later, in vLLM's loader."""
    if tuple(found) != tuple(expected):
        raise ConversionError(
            f"{name} is {list(found)} in the file, but the config mapped from its metadata makes it {list(expected)}"
        )


class _ShardWriter:
    """safetensors shards of up to SHARD_BYTES, and the index transformers and vLLM read when there are several."""

    def __init__(self, out: Path, save_file: Any) -> None:
        self.out, self.save_file = out, save_file
        self.pending: dict[str, Any] = {}
        self.pending_bytes = 0
        self.files: list[tuple[str, list[str]]] = []
        self.names: set[str] = set()
        self.total_bytes = 0

    def add(self, name: str, tensor: Any) -> None:
        size = tensor.numel() * tensor.element_size()
        if self.pending and self.pending_bytes + size > SHARD_BYTES:
            self._flush()
        self.pending[name] = tensor.contiguous()
        self.pending_bytes += size
        self.total_bytes += size
        self.names.add(name)

    def _flush(self) -> None:
        file = f"model-{len(self.files) + 1:05d}.safetensors"
        self.save_file(self.pending, self.out / file, metadata={"format": "pt"})
        self.files.append((file, list(self.pending)))
        self.pending, self.pending_bytes = {}, 0

    def close(self) -> None:
        if self.pending:
            self._flush()
        if len(self.files) == 1:
            os.rename(self.out / self.files[0][0], self.out / "model.safetensors")
            return
        count = len(self.files)
        weight_map = {}
        for index, (file, names) in enumerate(self.files, start=1):
            final = f"model-{index:05d}-of-{count:05d}.safetensors"
            os.rename(self.out / file, self.out / final)
            weight_map.update(dict.fromkeys(names, final))
        index_json = {"metadata": {"total_size": self.total_bytes}, "weight_map": weight_map}
        (self.out / "model.safetensors.index.json").write_text(json.dumps(index_json, indent=2))
