"""`SERVICE_MODEL=<a .gguf file>` serves that file: a tiny Qwen3 GGUF in K-quant blocks (tests/support/gguf_models.py),
converted at start into the cache, served under the file's name, its greedy tokens and logprobs matching
transformers' fp32 forward on the converted weights. Served in fp32: the file's random K-quant blocks make large
activations, whose bf16 rounding (mean 0.11 nat) would hide a conversion error that fp32 shows.

Both ways the service serves a file: dequantized (gguf_blocks=off), and from its own blocks on ggml's kernel (the
default where `make kernels` built it), here a tiny mistral file (llama's layout, whose Q/K rows llama.cpp
permutes) in Q4_0 with layer 0's v and down in Q8_0: its layer 0 merges q/k/v blocks of two types, its layer 1 of
one; its token embedding and its untied LM head keep their Q4_0 blocks too."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import torch
from openai import OpenAI

from service.facts.gguf import read_gguf
from service.in_vllm.contract import HANDOVER_ENV
from service.in_vllm.plugin import STATE_PREFIX
from service.kernels.registry import KERNELS, parse_handover
from service.policy.linear.ggml_handover import tables_for
from service.policy.machine.backends import BACKENDS
from tests.integration.conftest import _start
from tests.integration.test_reference import TEXTS
from tests.support.gguf_models import tiny_gguf
from tests.support.live_cpu import expected_backend, native_bf16
from tests.support.reference import compare, prompt_ids, query, reference_logprobs
from tests.support.release import release
from tests.support.server import MODELS

pytestmark = pytest.mark.engine
SERVED = "tiny-qwen3-Q4_K-v1"
MAX_DIFF, MEAN_DIFF = 0.01, 0.001  # fp32 against fp32: summation order only
KERNEL = KERNELS["ggml-gguf"].vllm_class


@pytest.fixture(scope="module")
def gguf_server(server_logs):
    path = tiny_gguf(MODELS, "qwen3", "Q4_K")
    server = _start(
        "gguf-file", server_logs, SERVED, model=str(path), kv_cache_gib="0.25", dtype="float32", gguf_blocks="off"
    )
    yield server, path
    release(server.process)


def test_the_file_is_converted_and_served_under_its_name(gguf_server):
    server, path = gguf_server
    (card,) = httpx.get(f"{server.url}/v1/models", timeout=30).json()["data"]
    assert card["id"] == SERVED and card["source"]["file"] == str(path)
    assert card["source"]["tensor_types"]["Q4_K"] > 0
    log = server.process.log_tail(10**6)
    # Converted at this start, or by an earlier one into the same cache (the copy is keyed by content).
    assert f"GGUF {path}: converted in" in log or f"GGUF {path}: using the converted copy" in log, log[-3000:]


def test_the_served_tokens_are_the_files_model(gguf_server):
    server, _ = gguf_server
    hardware = httpx.get(f"{server.url}/v1/hardware", timeout=30).json()
    converted = next(d["value"] for d in hardware["decisions"] if d["setting"] == "model.source")
    client = OpenAI(base_url=f"{server.url}/v1", api_key="unused")
    served = [query(client, SERVED, ids, 16) for ids in prompt_ids(converted, TEXTS)]
    result = compare(served, reference_logprobs(converted, [s.prompt + s.tokens for s in served]), 2 * MAX_DIFF, 0.02)
    assert result.top1_equal + result.near_ties == result.greedy, result
    assert result.passes(MAX_DIFF, MEAN_DIFF), result


@dataclass(frozen=True)
class BlocksCase:
    arch: str  # the tiny file's (tests/support/gguf_models.py)
    tensor_type: str
    kept: str  # model.gguf_blocks
    activation_block: int  # ggml quantizes each row's activations to 8 bits per this many inputs, for these types
    max_diff: float
    mean_diff: float


# One file covers both methods: layer 1's q/k/v is all Q4_0 (one handle), layer 0's mixes Q4_0 and Q8_0 (one per
# part). A mistral file: llama's layout (Q/K rows permuted by llama.cpp) with an untied output head, so the token
# embedding and the LM head keep blocks of their own (SmolLM2's quality check covers a head tied to the embedding).
# The reference quantizes activations as ggml does (dynamic_int8_inputs), the head's included. Measured: logprob max
# 0.014 / mean 0.0037, and against one layer's Q rows left in the file's order 0.092 / 0.020 (a tied llama file
# before the head kept its blocks: 0.010 / 0.0028 and 0.072 / 0.021). The K-quant files' random blocks make a model whose tokens sit at logprobs near -30, where
# 8-bit activations move them by nats: not a check.
BLOCKS_CASES = {"mistral-Q4_0+Q8_0": BlocksCase("mistral", "Q4_0+Q8_0", "Q4_0+Q8_0", 32, 0.03, 0.008)}


@dataclass
class BlocksRun:
    path: Path
    decisions: dict
    log: str
    served: list


@pytest.fixture(scope="module")
def blocks_runs(server_logs):
    """Each tiny file served from its blocks: recorded, then stopped (memory for the session's servers)."""
    done: dict[str, BlocksRun] = {}

    def run(case: BlocksCase) -> BlocksRun:
        if case not in done:
            path = tiny_gguf(MODELS, case.arch, case.tensor_type)
            served_name = path.stem
            server = _start(
                f"gguf-blocks/{case.arch}-{case.tensor_type}",
                server_logs,
                served_name,
                model=str(path),
                kv_cache_gib="0.25",
                dtype="float32",
            )
            try:
                hardware = httpx.get(f"{server.url}/v1/hardware", timeout=30).json()
                client = OpenAI(base_url=f"{server.url}/v1", api_key="unused")
                decisions = {d["setting"]: d for d in hardware["decisions"]}
                served = [query(client, served_name, i, 16) for i in prompt_ids(_dequantized_copy(path), TEXTS)]
                log = server.process.log_tail(10**6)
            finally:
                release(server.process)
            done[case] = BlocksRun(path, decisions, log, served)
        return done[case]

    return run


def _dequantized_copy(path: Path) -> Path:
    """The file dequantized to fp32, as gguf_blocks=off serves it: the reference's weights."""
    from service.facts.model import inspect_model
    from service.facts.software import read_software
    from service.models.gguf_convert import ensure_converted
    from service.policy.gguf.model_source import plan_model_source

    plan = plan_model_source(inspect_model(str(path)), "float32", MODELS, read_software(), frozenset())
    return ensure_converted(plan.conversion)


@pytest.mark.parametrize("case", BLOCKS_CASES.values(), ids=BLOCKS_CASES)
def test_a_files_blocks_are_served_on_ggmls_kernel_in_every_vllm_process(case, blocks_runs):
    run = blocks_runs(case)
    kept = run.decisions["model.gguf_blocks"]
    assert (kept["value"], kept["source"]) == (case.kept, "policy"), kept
    assert run.decisions["env.SERVICE_LINEAR_KERNELS"]["value"] == KERNEL
    states = [json.loads(line.split(STATE_PREFIX, 1)[1]) for line in run.log.splitlines() if STATE_PREFIX in line]
    assert {s["process"] for s in states} >= {"MainProcess", "EngineCore"} and len(states) >= 3, states
    assert all(s["linear_kernels"] == {KERNEL: "registered"} for s in states), states
    # Where the op hands batches to the GEMM: the live backend's tables on this CPU (its bf16 one in software
    # without native bf16, by torch's test), read by every vLLM process
    planned = parse_handover(run.decisions[f"env.{HANDOVER_ENV}"]["value"])
    tables = tables_for(BACKENDS[expected_backend()].ggml_handover, native_bf16())
    assert planned == {dtype: dict(t.rows) for dtype, t in tables.items()}
    assert all(s["ggml_handover"] == planned for s in states), states
    assert f"[service] GGUF blocks: {case.kept} linear layers on ggml's kernel" in run.log
    # The token embedding and the LM head, each on its own blocks: the lookup and ggml's matmul.
    embedding, output = read_gguf(run.path).heads
    value = f"{embedding.type_name} (token embedding), {output.type_name} (LM head)"
    assert run.decisions["model.gguf_head_blocks"]["value"] == value
    assert f"[service] GGUF blocks: {embedding.type_name} VocabParallelEmbedding on ggml's kernel" in run.log
    assert f"[service] GGUF blocks: {output.type_name} ParallelLMHead on ggml's kernel" in run.log


@pytest.mark.parametrize("case", BLOCKS_CASES.values(), ids=BLOCKS_CASES)
def test_the_blocks_compute_what_the_file_says(case, blocks_runs):
    from harness.quantized_models import dynamic_int8_inputs

    run = blocks_runs(case)
    dequantized = _dequantized_copy(run.path)

    def as_ggml(model):  # the decoder's projections and the LM head, on blocks whose activations are 8-bit per block
        layers = frozenset(n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and ".layers." in n)
        dynamic_int8_inputs(model, layers | {"lm_head"}, case.activation_block)

    def as_stored_order(model):  # what blocks copied without transformers' un-permutation of Q rows would compute
        as_ggml(model)
        q = model.model.layers[0].self_attn.q_proj.weight
        heads = model.config.num_attention_heads
        q.copy_(q.reshape(heads, q.shape[0] // heads // 2, 2, -1).transpose(1, 2).reshape(q.shape))

    sequences = [s.prompt + s.tokens for s in run.served]
    result = compare(run.served, reference_logprobs(dequantized, sequences, corrupt=as_ggml), 0.05, 0.02)
    print(f"\n{case.kept} blocks on ggml's kernel vs the dequantized file: {result}")
    assert result.top1_equal + result.near_ties == result.greedy, result
    assert result.passes(case.max_diff, case.mean_diff), result
    wrong = compare(run.served, reference_logprobs(dequantized, sequences, corrupt=as_stored_order), 0.05, 0.02)
    print(f"against one layer's Q rows in the file's order: {wrong}")
    assert not wrong.passes(case.max_diff, case.mean_diff), wrong
