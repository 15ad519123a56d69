"""A GGUF file's linear layers kept as its own blocks (service/policy/gguf/model_source.py choose_blocks,
service/models/gguf_convert.py, service/kernels/gguf_blocks.py): when the policy keeps them, what the converter writes (the
file's rows, in the order transformers gives the dequantized rows), and ggml's op on every kept type against
gguf-py's dequantization of the same rows."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from service.facts.gguf import LINEAR_TENSOR, read_gguf
from service.facts.model import inspect_model
from service.facts.software import read_software
from service.in_vllm.contract import KERNELS_ENV
from service.kernels.registry import BLOCKS_METHOD, KERNELS
from service.models.gguf_convert import ensure_converted
from service.policy.gguf.model_source import (
    BLOCK_TYPES,
    choose_blocks,
    kept_bytes,
    kept_heads,
    plan_model_source,
)
from tests.support.gguf_models import tiny_gguf
from tests.support.server import MODELS

SOFTWARE = read_software()
BUILT = "ggml built from llama.cpp b1234"


def _facts(arch: str = "llama", tensor_type: str = "Q4_1"):
    return read_gguf(tiny_gguf(MODELS, arch, tensor_type))


def test_a_file_of_one_kept_type_keeps_its_blocks_by_default():
    choice = choose_blocks(_facts(), "auto", False, BUILT, default_model=False)
    assert (choice.type_name, choice.source, choice.error) == ("Q4_1", "policy", None)
    assert "tok/s" in choice.reason  # the measurement it rests on


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"architecture": "starcoder2"}, "not 'starcoder2'"),
        ({"linear_types": (("Q4_K", 10), ("F16", 4))}, "include F16, not a type ggml's kernel computes"),
        ({"linear_types": (("F16", 14),)}, "not a type ggml's kernel computes"),
        ({"linear_types": ()}, "none of llama.cpp's decoder linear tensors"),
    ],
)
def test_files_the_kernel_cannot_serve_as_stored_are_dequantized_or_refused_when_asked(change, why):
    facts = replace(_facts(), **change)
    auto = choose_blocks(facts, "auto", False, BUILT, default_model=False)
    assert auto.type_name is None and why in auto.reason and auto.error is None
    asked = choose_blocks(facts, "on", True, BUILT, default_model=False)
    assert asked.type_name is None and asked.error is not None and why in asked.error


def test_without_the_kernel_build_or_for_the_default_model_auto_dequantizes():
    missing = choose_blocks(_facts(), "auto", False, None, default_model=False)
    assert missing.type_name is None and "make kernels" in missing.reason
    assert choose_blocks(_facts(), "on", True, None, default_model=False).error is not None
    default = choose_blocks(_facts(), "auto", False, BUILT, default_model=True)
    assert default.type_name is None and default.source == "default" and "gguf_blocks=on" in default.reason
    assert choose_blocks(_facts(), "on", True, BUILT, default_model=True).type_name == "Q4_1"
    off = choose_blocks(_facts(), "off", True, BUILT, default_model=False)
    assert (off.type_name, off.source) == (None, "user")


def test_a_k_quant_mix_keeps_each_tensors_blocks_on_one_rank():
    facts = replace(_facts(), linear_types=(("Q4_K", 10), ("Q6_K", 4)))
    mixed = choose_blocks(facts, "auto", False, BUILT, False)
    assert mixed.type_name == "Q4_K+Q6_K" and "each part of a merged q/k/v" in mixed.reason
    split = choose_blocks(facts, "auto", False, BUILT, False, tp_size=2)
    assert split.type_name is None and "mix types (Q4_K x10, Q6_K x4)" in split.reason


def test_a_tensor_parallel_size_that_splits_blocks_keeps_none():
    facts = _facts("llama", "Q4_K")  # 256-value blocks; hidden size 256
    assert choose_blocks(facts, "auto", False, BUILT, False, tp_size=1).type_name == "Q4_K"
    split = choose_blocks(facts, "auto", False, BUILT, False, tp_size=2)
    assert split.type_name is None and "tensor-parallel size 2" in split.reason


def test_the_plan_names_the_kernel_the_plugin_registers_and_a_copy_of_its_own(tmp_path):
    model = inspect_model(str(tiny_gguf(MODELS, "llama", "Q4_0")))
    kept = choose_blocks(model.gguf, "auto", False, BUILT, default_model=False)
    plan = plan_model_source(model, "float32", tmp_path, SOFTWARE, frozenset(), blocks=kept)
    dequantized = plan_model_source(model, "float32", tmp_path, SOFTWARE, frozenset())
    assert plan.conversion.blocks == "Q4_0" and dequantized.conversion.blocks is None
    assert plan.engine_model != dequantized.engine_model
    assert plan.result.env[KERNELS_ENV] == KERNELS["ggml-gguf"].vllm_class
    assert plan.result.find("model.gguf_blocks").value == "Q4_0"
    assert KERNELS_ENV not in dequantized.result.env


def test_a_head_keeps_its_blocks_only_in_a_type_and_size_ggml_computes(tmp_path):
    model = inspect_model(str(tiny_gguf(MODELS, "llama", "Q4_0")))
    gguf = model.gguf
    (embedding,) = gguf.heads  # tied: the token embedding is the LM head
    assert embedding.read_per_token and kept_heads(gguf) == (embedding,)
    kept = choose_blocks(gguf, "auto", False, BUILT, default_model=False)
    plan = plan_model_source(model, "float32", tmp_path, SOFTWARE, frozenset(), blocks=kept)
    assert plan.conversion.heads == ("token_embd.weight",)
    head = plan.result.find("model.gguf_head_blocks")
    assert head.value == "Q4_0 (token embedding, the tied LM head)" and "bench.tools.lm_head" in head.reason
    # Every float tensor left is an fp32 norm, as the file stores it: an fp32 engine reads what the file holds.
    assert kept_bytes(gguf, per_token=True) == (
        gguf.linear_bytes + embedding.n_bytes,
        gguf.linear_elements + embedding.n_elements,
    )
    assert plan.result.find("model.source").reason.endswith("as the engine holds it (x1.00)")

    for change, why in (
        ({"heads": (replace(embedding, type_name="F16"),)}, "token_embd.weight F16: not a type ggml's kernel"),
        ({"config": {**gguf.config, "hidden_size": 576}, "heads": (replace(embedding, type_name="Q4_K"),)}, "576"),
    ):
        other = replace(gguf, **change)
        assert kept_heads(other) == ()
        plan = plan_model_source(replace(model, gguf=other), "float32", tmp_path, SOFTWARE, frozenset(), blocks=kept)
        assert plan.conversion.heads == () and why in plan.result.find("model.gguf_head_blocks").reason
        assert plan.result.find("model.gguf_head_blocks").value == "dequantized"


@pytest.mark.parametrize("tensor_type", ["Q4_1", "Q4_K_M"])
def test_a_decode_step_reads_q4_1_blocks_as_ggml_holds_them(tensor_type, tmp_path):
    """ggml's op holds Q4_1 as repacked Q4_0 plus an fp32 offset per 32-block: 22 bytes a block where the file
    stores 20. Other types are read as stored."""
    model = inspect_model(str(tiny_gguf(MODELS, "llama", tensor_type)))
    gguf = model.gguf
    assert sum(n for _, n in gguf.linear_type_elements) == gguf.linear_elements
    assert {t for t, _ in gguf.linear_type_elements} == {t for t, _ in gguf.linear_types}
    heads = [h for h in kept_heads(gguf) if h.read_per_token]
    stored = gguf.linear_bytes + sum(h.n_bytes for h in heads)
    q4_1 = dict(gguf.linear_type_elements).get("Q4_1", 0) + sum(h.n_elements for h in heads if h.type_name == "Q4_1")
    read_bytes, _ = kept_bytes(gguf, per_token=True)
    assert read_bytes == stored + q4_1 // 32 * 2
    assert (q4_1 > 0) == (tensor_type == "Q4_1")
    assert kept_bytes(gguf, per_token=False)[0] == gguf.linear_bytes + sum(h.n_bytes for h in kept_heads(gguf))
    kept = choose_blocks(gguf, "on", True, BUILT, default_model=False)
    reason = (
        plan_model_source(model, "float32", tmp_path, SOFTWARE, frozenset(), blocks=kept)
        .result.find("model.source")
        .reason
    )
    assert ("ggml holds Q4_1 as repacked Q4_0" in reason) == (tensor_type == "Q4_1")


@pytest.mark.kernels
@pytest.mark.parametrize("tensor_type", BLOCK_TYPES)
@pytest.mark.parametrize("parts", [1, 3])
def test_the_embedding_lookup_dequantizes_the_rows_asked_for(tensor_type, parts):
    """Each looked-up row as gguf-py dequantizes it, from any slice, repacked (Q4_0) or not; a row out of range is an
    error, not a read past the weight."""
    from gguf import GGMLQuantizationType

    from service.kernels.ggml_linear import load_library

    load_library()
    tensor = next(t for t in _file_tensors(tensor_type) if t.name == "token_embd.weight")
    k = int(tensor.shape[0])
    blocks = np.asarray(tensor.data, dtype=np.uint8).reshape(int(tensor.shape[1]), -1)
    n = blocks.shape[0]
    handle = torch.ops.service_ggml.load(
        torch.from_numpy(blocks.copy()), int(GGMLQuantizationType[tensor_type]), k, n, parts
    )
    ids = torch.tensor([0, n - 1, 7, 8, n // 2, n // 3 + 1, 7])
    got = torch.ops.service_ggml.embedding(ids, handle, k)
    torch.testing.assert_close(got, _dequantized_rows(blocks[ids.numpy()], tensor_type), rtol=0, atol=0)
    with pytest.raises(RuntimeError, match=f"row {n} of {n}"):
        torch.ops.service_ggml.embedding(torch.tensor([n]), handle, k)


def _dequantized_rows(rows: np.ndarray, type_name: str) -> torch.Tensor:
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    return torch.from_numpy(dequantize(rows, GGMLQuantizationType[type_name]).copy())


@pytest.mark.parametrize(
    ("arch", "tensor_type"), [("llama", "Q4_0"), ("llama", "Q4_K"), ("qwen2", "Q8_0"), ("llama", "Q4_K_M")]
)
def test_the_converted_blocks_are_the_files_rows_in_transformers_order(arch, tensor_type, tmp_path):
    """llama's Q/K rows are un-permuted by transformers: the blocks must follow, or attention reads wrong heads."""
    from safetensors.torch import load_file

    model = inspect_model(str(tiny_gguf(MODELS, arch, tensor_type)))
    kept = choose_blocks(model.gguf, "on", True, BUILT, default_model=False)
    blocks_dir = ensure_converted(
        plan_model_source(model, "float32", tmp_path, SOFTWARE, frozenset(), blocks=kept).conversion
    )
    floats_dir = ensure_converted(plan_model_source(model, "float32", tmp_path, SOFTWARE, frozenset()).conversion)
    blocks, floats = (
        load_file(Path(blocks_dir) / "model.safetensors"),
        load_file(Path(floats_dir) / "model.safetensors"),
    )
    stored = [name for name, t in blocks.items() if t.dtype == torch.uint8]
    linear = [name for name in stored if ".layers." in name]
    assert len(linear) == 7 * model.gguf.config["num_hidden_layers"]
    # The tiny files store their embedding (and untied head) in the file's type: whole blocks of the hidden size.
    heads = {"token_embd.weight": "model.embed_tokens.weight", "output.weight": "lm_head.weight"}
    assert sorted(set(stored) - set(linear)) == sorted(heads[h.name] for h in kept_heads(model.gguf))
    assert any(h.read_per_token for h in kept_heads(model.gguf))  # the LM head, tied or not
    quantization = json.loads((Path(blocks_dir) / "config.json").read_text())["quantization_config"]
    assert quantization["quant_method"] == BLOCKS_METHOD and quantization["ggml_type"] == kept.type_name
    types = quantization["types"]  # per module: the file's type for it
    tied = model.gguf.config.get("tie_word_embeddings", False)
    assert sorted(types) == sorted([name.removesuffix(".weight") for name in stored] + (["lm_head"] if tied else []))
    assert {types[name.removesuffix(".weight")] for name in linear} == set(kept.type_name.split("+"))
    for name in stored:
        dequantized = _dequantized_rows(blocks[name].numpy(), types[name.removesuffix(".weight")])
        torch.testing.assert_close(dequantized, floats[name], rtol=0, atol=0)
    assert all(t.dtype == torch.float32 for name, t in blocks.items() if name not in stored)


@pytest.mark.kernels
@pytest.mark.parametrize("tensor_type", BLOCK_TYPES)
@pytest.mark.parametrize(
    ("rows", "path"),  # ggml's int8-activation path, the dequantize + GEMM one, and the one the method picks at 200
    [(1, 128), (200, 128), (200, "method")],
)
def test_the_op_computes_each_kept_type_as_its_dequantization(tensor_type, rows, path):
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    from service.kernels.ggml_linear import load_library

    load_library()
    g = torch.Generator().manual_seed(0)
    n, k = 64, 512
    weight = (torch.randn(n, k, generator=g) * 0.05).numpy()
    qtype = GGMLQuantizationType[tensor_type]
    try:
        blocks = quantize(weight, qtype)
    except NotImplementedError:  # gguf-py does not quantize K-quants: the tiny file's random blocks stand in
        tensor = next(t for t in _file_tensors(tensor_type) if LINEAR_TENSOR.fullmatch(t.name))
        blocks = np.asarray(tensor.data, dtype=np.uint8).reshape(int(np.prod(tensor.shape[1:])), -1)
        n, k = blocks.shape[0], int(tensor.shape[0])
    exact = _dequantized_rows(blocks, tensor_type)
    x = torch.randn(rows, k, generator=g)
    handle = torch.ops.service_ggml.load(torch.from_numpy(blocks.copy()), int(qtype), k, n, 2)
    dense_from = path
    if path == "method":  # the kernels' hand-over for the type outside a planned engine (0: ggml at every row count)
        from service.kernels.ggml_linear import dense_from as method_dense_from
        from service.kernels.ggml_linear import handover

        dense_from = method_dense_from(handover(tensor_type), x.dtype)
    got = torch.ops.service_ggml.linear(x, handle, n, None, dense_from)
    want = x @ exact.T
    error = ((got - want).abs().max() / want.abs().max()).item()
    # ggml quantizes the activations (8-bit per block); the GEMM path is fp32's, so the error tells the paths apart.
    on_ggml = dense_from == 0 or rows < dense_from
    assert (1e-4 < error <= 0.02) if on_ggml else error <= 1e-4, (dense_from, error)


@pytest.mark.kernels
def test_the_dense_path_splits_across_threads_under_inference_mode():
    """vLLM runs the model under torch.inference_mode(). A rank with more than one OpenMP thread (a server with more
    cores than this test machine's one compute core) dequantizes and multiplies the slices on threads that must work
    in the caller's mode: the output, made in it, refuses a copy_ from outside it."""
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    from service.kernels.ggml_linear import load_library

    load_library()
    g = torch.Generator().manual_seed(1)
    n, k = 64, 512
    blocks = quantize((torch.randn(n, k, generator=g) * 0.05).numpy(), GGMLQuantizationType.Q8_0)
    handle = torch.ops.service_ggml.load(torch.from_numpy(blocks.copy()), int(GGMLQuantizationType.Q8_0), k, n, 2)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with torch.inference_mode():
            x = torch.randn(8, k, generator=g)
            got = torch.ops.service_ggml.linear(x, handle, n, None, 8)  # two slices, on two threads
    finally:
        torch.set_num_threads(threads)
    torch.testing.assert_close(got, x @ _dequantized_rows(blocks, "Q8_0").T, rtol=1e-4, atol=1e-4)


def _file_tensors(tensor_type: str):
    from gguf import GGUFReader

    return GGUFReader(tiny_gguf(MODELS, "llama", tensor_type)).tensors
