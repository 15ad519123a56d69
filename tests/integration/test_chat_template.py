"""The chat_template setting on the real engine: a base model (the demo model without its template) served with a
template file. The policy hands vLLM the file, chooses the parsers from it, and the chat route renders with it."""

from __future__ import annotations

import shutil

import httpx
import openai
import pytest

from service.models.demo_model import demo_dir
from tests.integration.conftest import _start
from tests.support.release import release
from tests.support.server import MODELS

pytestmark = pytest.mark.engine

SERVED = "base-model"
# Marks no format the policy knows: the forced_only tool parser, no reasoning parser.
TEMPLATE = (
    "{% for message in messages %}[[{{ message['role'] }} says]] {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}[[assistant says]] {% endif %}"
)


@pytest.fixture(scope="module")
def base_server(server_logs, tmp_path_factory):
    root = tmp_path_factory.mktemp("chat-template")
    model = root / "base-model"
    shutil.copytree(demo_dir(MODELS), model)
    (model / "chat_template.jinja").unlink()  # a base model: no template of its own
    template = root / "template.jinja"
    template.write_text(TEMPLATE)
    server = _start("chat-template", server_logs, SERVED, model=str(model), chat_template=str(template))
    yield server, template
    release(server.process)


def test_a_base_model_chats_with_the_template_file_it_was_given(base_server):
    server, template = base_server
    report = httpx.get(f"{server.url}/v1/hardware").json()
    decisions = {d["setting"]: d for d in report["decisions"]}
    assert decisions["engine.chat_template"]["value"] == str(template), decisions.get("engine.chat_template")
    assert decisions["engine.chat_template"]["source"] == "user"
    assert report["model"]["chat_template"]["source"] == str(template)
    assert decisions["engine.tool_call_parser"]["value"] == "forced_only", decisions["engine.tool_call_parser"]
    # The chat route renders the conversation with the file.
    messages = [{"role": "user", "content": "hello world"}]
    ids = httpx.post(
        f"{server.url}/tokenize", json={"model": SERVED, "messages": messages, "add_generation_prompt": True}
    ).json()["tokens"]
    text = httpx.post(f"{server.url}/detokenize", json={"model": SERVED, "tokens": ids}).json()["prompt"]
    assert "[[user says]] hello world\n[[assistant says]] " in text, text
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    out = client.chat.completions.create(model=SERVED, messages=messages, max_tokens=4, temperature=0)
    assert out.usage.prompt_tokens == len(ids) and out.usage.completion_tokens == 4
