"""The real MiniLM sentence-embedding model (shipped in a PyPI wheel) served through /v1/embeddings."""

from __future__ import annotations

import math

import openai
import pytest

pytestmark = pytest.mark.engine


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
