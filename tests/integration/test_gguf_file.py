"""`SERVICE_MODEL=<a .gguf file>` serves that file: a tiny Qwen3 GGUF in K-quant blocks (tests/support/gguf_models.py),
converted at start into the cache, served under the file's name, its greedy tokens and logprobs matching
transformers' fp32 forward on the converted weights. Served in fp32: the file's random K-quant blocks make large
activations, whose bf16 rounding (mean 0.11 nat) would hide a conversion error that fp32 shows."""

from __future__ import annotations

import httpx
import pytest
from openai import OpenAI

from tests.integration.conftest import _start
from tests.integration.test_reference import TEXTS
from tests.support.gguf_models import tiny_gguf
from tests.support.reference import compare, prompt_ids, query, reference_logprobs
from tests.support.server import MODELS

pytestmark = pytest.mark.engine
SERVED = "tiny-qwen3-Q4_K-v1"
MAX_DIFF, MEAN_DIFF = 0.01, 0.001  # fp32 against fp32: summation order only


@pytest.fixture(scope="module")
def gguf_server(server_logs):
    path = tiny_gguf(MODELS, "qwen3", "Q4_K")
    server = _start("gguf-file", server_logs, SERVED, model=str(path), kv_cache_gib="0.25", dtype="float32")
    yield server, path
    server.process.close()


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
