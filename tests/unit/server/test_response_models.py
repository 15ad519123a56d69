"""vLLM's response models lose the request-side validator; requests keep it; what the server sends is unchanged."""

from __future__ import annotations

import json
import subprocess
import sys

# Runs in a fresh process: the drop is for the life of a process, and "before" must be vLLM's models as shipped.
PROBE = r"""
import json
from vllm.entrypoints.generate.base.protocol import DeltaFunctionCall, DeltaMessage, DeltaToolCall
from vllm.entrypoints.openai.chat_completion.protocol import (
    ChatCompletionLogProb, ChatCompletionLogProbs, ChatCompletionLogProbsContent, ChatCompletionRequest,
    ChatCompletionResponse, ChatCompletionResponseChoice, ChatCompletionResponseStreamChoice,
    ChatCompletionStreamResponse, ChatMessage,
)
from vllm.entrypoints.openai.completion.protocol import (
    CompletionRequest, CompletionResponseStreamChoice, CompletionStreamResponse,
)
from vllm.entrypoints.serve.engine.protocol import UsageInfo
from service.server.openai_compat.response_models import VALIDATOR, drop_request_validator, response_models

def answers():
    logprob = ChatCompletionLogProbsContent(
        token="a", logprob=-0.5, bytes=[97], top_logprobs=[ChatCompletionLogProb(token="b", logprob=-1.0)]
    )
    tool = DeltaToolCall(index=0, id="call_1", type="function", function=DeltaFunctionCall(name="f", arguments="{}"))
    deltas = [DeltaMessage(content=" a"), DeltaMessage(role="assistant", content=""), DeltaMessage(tool_calls=[tool])]
    out = []
    for delta in deltas:
        choice = ChatCompletionResponseStreamChoice(
            index=0, delta=delta, logprobs=ChatCompletionLogProbs(content=[logprob]), finish_reason=None
        )
        chunk = ChatCompletionStreamResponse(id="c", created=1, choices=[choice], model="m")
        chunk.usage = UsageInfo(prompt_tokens=3, completion_tokens=1, total_tokens=4)
        out.append(chunk.model_dump_json(exclude_unset=True))
    full = ChatCompletionResponse(
        id="c", created=1, model="m", usage=UsageInfo(prompt_tokens=1, completion_tokens=1, total_tokens=2),
        choices=[ChatCompletionResponseChoice(index=0, message=ChatMessage(role="assistant", content="hi"))],
    )
    out.append(full.model_dump_json(exclude_unset=True))
    text = CompletionStreamResponse(
        id="t", created=1, model="m", choices=[CompletionResponseStreamChoice(index=0, text="x", finish_reason="stop")]
    )
    out.append(text.model_dump_json(exclude_unset=True))
    return out

def carrying():
    return sorted(m.__name__ for m in response_models() if VALIDATOR in repr(m.__pydantic_validator__))

before, had = answers(), carrying()
dropped = drop_request_validator()
print(json.dumps({
    "had": had, "dropped": dropped, "left": carrying(), "same": before == answers(), "answers": answers(),
    "requests": [VALIDATOR in repr(m.__pydantic_validator__) for m in (ChatCompletionRequest, CompletionRequest)],
    "streamed_chunk_models": [m.__name__ for m in (ChatCompletionStreamResponse, ChatCompletionResponseStreamChoice,
                                                   DeltaMessage)],
}))
"""


def _probe() -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_response_models_lose_the_validator_and_answer_the_same():
    probe = _probe()
    assert set(probe["streamed_chunk_models"]) <= set(probe["had"]), "vLLM's streamed chunk models carry it as shipped"
    assert probe["left"] == [], f"still validated on construction: {probe['left']}"
    assert set(probe["dropped"]) >= set(probe["streamed_chunk_models"])
    assert probe["same"], "the JSON the server sends changed"
    assert all(json.loads(answer) for answer in probe["answers"])
    assert probe["requests"] == [True, True], "request models must keep logging the fields vLLM ignores"
