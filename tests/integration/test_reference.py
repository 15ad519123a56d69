"""The service's kernels against a reference, on whatever CPU runs the tests.

Greedy decode through /v1/completions (prompt as token ids, logprobs of the prompt and of the chosen tokens), then
Hugging Face transformers' fp32 forward teacher-forced on the same tokens. The service computes in bf16 through
this CPU's kernels (AMX, AVX-512 BF16, zentorch or emulated bf16); the reference in fp32 through PyTorch's.

Tolerances, from measurement (3 prompts, 24 greedy tokens each; prompt and continuation logprobs compared):
- measured max / mean |service - fp32| logprob: demo Llama 0.0066 / 0.0018, tiny Qwen3-Next 0.0099 / 0.0026 on
  the Emerald Rapids VM (AVX-512 BF16, no AMX); on Zen 5 (zentorch) the max was 0.006 and 0.012.
- MAX_DIFF 0.05 (5x the largest measured) catches a local break; MEAN_DIFF 0.005 (2x the largest measured mean)
  catches a small systematic one: one layer's weight scaled by 1.05 moved the mean to 0.0077 (Llama o_proj) and
  0.016 (a GDN layer's out_proj), two swapped rows moved the max to 0.12 / 0.13 (same recorded numbers).
- TIE_MARGIN: each of two logprobs may move by MAX_DIFF, so a greedy pick may differ from fp32's top-1 only
  where fp32's top-2 margin is below 2 x MAX_DIFF (the random tiny models are flat: logprobs near -6.5).
- ROUTER_MARGIN: an MoE router whose fp32 gap between its last chosen and first unchosen expert is below 0.02
  may choose the other expert in bf16 (transformers' own bf16 forward moves router logits by up to 0.0093 here),
  a discrete jump (0.135 measured at a gap of 0.0007): such positions are left out of the logprob statistics.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from openai import OpenAI

from service.in_vllm.plugin import STATE_PREFIX
from service.kernels.registry import KERNELS
from service.models.demo_model import demo_dir
from service.policy.linear.dense_kernel import OURS_BF16
from tests.integration.conftest import _start
from tests.support.reference import compare, prompt_ids, query, reference_logprobs, scale_weight, swap_rows
from tests.support.release import release
from tests.support.server import MODELS
from tests.support.tiny_models import tiny_qwen3_next

BF16_KERNEL = KERNELS["bf16-weights"]
MAX_DIFF = 0.05
FP32_MAX_DIFF = 0.001  # the fp32 engine on bf16 weights: measured 7e-7 (Zen 4)
MEAN_DIFF = 0.005
TIE_MARGIN = 2 * MAX_DIFF
ROUTER_MARGIN = 0.02
MAX_TOKENS = 24
TEXTS = [
    "The quick brown fox jumps over the lazy dog",
    "Once upon a time in a small village",
    "The service answers questions about the weather",
]


def _record(server, model_dir: Path) -> tuple[Path, list]:
    client = OpenAI(base_url=f"{server.url}/v1", api_key=server.api_key or "unused")
    return model_dir, [query(client, server.served_model, ids, MAX_TOKENS) for ids in prompt_ids(model_dir, TEXTS)]


@pytest.fixture(scope="module")
def llama(chat_server):
    """The demo model as the chat server runs it. In a bf16 engine on a CPU without native bf16 the policy may run
    its linear layers on the service's kernel: what the server decided is what its engine must have run."""
    report = httpx.get(f"{chat_server.url}/v1/hardware", headers=chat_server.headers(), timeout=30).json()
    decided = {d["setting"]: d["value"] for d in report["decisions"]}
    ours = (decided["engine.dtype"], decided.get("engine.linear_weights")) == ("bfloat16", OURS_BF16)
    log = chat_server.process.log_tail(10**7)
    assert ("kept bf16, run by the service's kernel (fp32 arithmetic, bf16 output)" in log) == ours, log[-3000:]
    return _record(chat_server, demo_dir(MODELS))


@pytest.fixture(scope="module")
def llama_bf16_weights(server_logs):
    """The demo model (bf16 values) computed in fp32 with its linear weights kept bf16 by the service's kernel, as
    AVX2 hosts run fp32 engines by default; asked for here, so it runs on every CPU. Recorded, then stopped: the
    session's later servers need its memory."""
    server = _start("bf16-weights", server_logs, "demo-tiny-llama", dtype="float32", bf16_weights="on")
    try:
        log = server.process.log_tail(10**7)
        assert f"{BF16_KERNEL.log_markers[0]} layer" in log and "kept bf16" in log, log[-3000:]
        states = [json.loads(line.split(STATE_PREFIX, 1)[1]) for line in log.splitlines() if STATE_PREFIX in line]
        assert states and all(s["linear_kernels"] == {BF16_KERNEL.vllm_class: "registered"} for s in states), states
        return _record(server, demo_dir(MODELS))
    finally:
        release(server.process)


@pytest.fixture(scope="module")
def gdn(gdn_server):
    return _record(gdn_server, tiny_qwen3_next(MODELS))


def _sequences(served) -> list[tuple[int, ...]]:
    return [s.prompt + s.tokens for s in served]


@pytest.mark.parametrize("recorded", ["llama", "llama_bf16_weights", "gdn"])
def test_service_matches_transformers_fp32(recorded, request):
    model_dir, served = request.getfixturevalue(recorded)
    result = compare(served, reference_logprobs(model_dir, _sequences(served)), TIE_MARGIN, ROUTER_MARGIN)
    print(f"\n{recorded}: {result}")
    assert result.greedy == len(TEXTS) * MAX_TOKENS
    assert result.top1_equal + result.near_ties == result.greedy, result
    assert result.positions >= result.greedy  # router near-ties leave most positions in
    assert result.passes(MAX_DIFF, MEAN_DIFF), result
    if recorded == "llama_bf16_weights":  # fp32 products of the same values: a bf16 activation would move ~0.005
        assert result.max_abs_diff < FP32_MAX_DIFF, result


# A kernel bug as a reference with one layer broken: the same comparison on the same recorded numbers must fail.
CORRUPTIONS = {
    "llama": [
        scale_weight("model.layers.0.self_attn.o_proj.weight", 1.05),
        swap_rows("model.layers.0.self_attn.o_proj.weight"),
    ],
    "gdn": [
        scale_weight("model.layers.0.linear_attn.out_proj.weight", 1.05),
        swap_rows("model.layers.0.linear_attn.out_proj.weight"),
    ],
}


@pytest.mark.parametrize(("recorded", "which"), [(m, i) for m, c in CORRUPTIONS.items() for i in range(len(c))])
def test_a_broken_kernel_fails_the_same_check(recorded, which, request):
    model_dir, served = request.getfixturevalue(recorded)
    broken = reference_logprobs(model_dir, _sequences(served), corrupt=CORRUPTIONS[recorded][which])
    result = compare(served, broken, TIE_MARGIN, ROUTER_MARGIN)
    print(f"\n{recorded} corruption {which}: {result}")
    assert not result.passes(MAX_DIFF, MEAN_DIFF), result
