"""bench/parts/replay.py and the session it replays: the kept recording is the pinned Claude Code's, a replayed request
keeps the prompt and nothing else, and the table is read from recorded runs."""

from __future__ import annotations

import re

from bench.parts import replay
from bench.servers import SERVED
from harness import REPO, agent_session


def pinned_claude_code() -> str:
    found = re.search(r"^CLAUDE_CODE_VERSION := (\S+)$", (REPO / "mk/agents.mk").read_text(), re.M)
    assert found, "mk/agents.mk pins no Claude Code version"
    return found.group(1)


def test_the_kept_session_is_the_pinned_claude_codes_and_each_turn_resends_the_last():
    kept = replay.kept_session()
    # A new pin makes a new recording: the agent clients' test writes it into .cache/agent-sessions/, to be kept here.
    assert kept.name == agent_session.file_name("claude-code", pinned_claude_code()), kept
    session = agent_session.load(kept)
    assert session.client == "claude-code" and session.version == pinned_claude_code()
    assert len(session.requests) >= 2 and {r["path"] for r in session.requests} == {"/v1/messages"}
    assert agent_session.CHECKOUT in kept.read_text() and str(REPO) not in kept.read_text()
    # What prefix caching is for: a later turn starts with the text of every message of the one before it (Claude
    # Code re-sends a message's text blocks as one string).
    for before, after in zip(session.requests, session.requests[1:], strict=False):
        first, then = before["body"]["messages"], after["body"]["messages"]
        assert len(then) > len(first) and [text_of(m) for m in then[: len(first)]] == [text_of(m) for m in first]
        assert after["body"]["system"] == before["body"]["system"]


def text_of(message: dict) -> tuple[str, str]:
    content = message["content"]
    text = content if isinstance(content, str) else "".join(b.get("text", "") for b in content)
    return message["role"], text


def test_a_replayed_request_keeps_the_prompt_and_leaves_the_rest_out():
    body = {
        "model": "claude-sonnet",
        "system": [{"type": "text", "text": "You are Claude Code."}],
        "messages": [
            {"role": "user", "content": "hi"},
            {
                "role": "assistant",
                "content": [{"type": "thinking", "thinking": "hm", "signature": ""}, {"type": "text", "text": "yes"}],
            },
            {"role": "user", "content": [{"type": "text", "text": "go on"}]},
        ],
        "tools": [{"name": "Bash", "input_schema": {"type": "object"}}],
        "tool_choice": {"type": "auto"},
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "metadata": {"user_id": "x"},
        "context_management": {},
        "output_config": {},
        "max_tokens": 32000,
        "stream": True,
    }
    sent = replay.replayed(body, max_tokens=32, tools=False)
    assert sent["model"] == SERVED and sent["max_tokens"] == 32 and sent["temperature"] == 0 and sent["stream"]
    assert sent["system"] == body["system"]
    assert sent["messages"][1]["content"] == [{"type": "text", "text": "yes"}]
    assert sent["messages"][0] == body["messages"][0] and sent["messages"][2] == body["messages"][2]
    assert not set(sent) & {"tools", "tool_choice", "thinking", "metadata", "context_management", "output_config"}
    with_tools = replay.replayed(body, 32, tools=True)
    assert with_tools["tools"] == body["tools"] and with_tools["tool_choice"] == body["tool_choice"]
    assert replay.replayed(body | {"max_tokens": 8}, 32, tools=False)["max_tokens"] == 8
    assert body["messages"][1]["content"][0]["type"] == "thinking"  # the recording itself is left as it was


def _request(i: int, prompt: int, cached: int, ttft: float, total: float) -> dict:
    return {"request": i, "prompt_tokens": prompt, "cached_tokens": cached, "ttft_s": ttft, "total_s": total}


def test_the_table_takes_each_requests_median_times_and_fewest_cached_tokens():
    data = {
        "client": "claude-code 9.9.9",
        "session": "claude-code-9.9.9-session.json",
        "gguf": "/x/SmolLM2.gguf",
        "max_tokens": 32,
        "tools": False,
        "threads": 1,
        "runs": [
            {"server": "ours", "rep": 0, "requests": [_request(0, 4100, 0, 2.0, 3.0), _request(1, 4200, 4096, 0.2, 1)]},
            {
                "server": "llama.cpp",
                "rep": 0,
                "requests": [_request(0, 4100, 0, 5.0, 6.0), _request(1, 4200, 4099, 1, 2)],
            },
            {"server": "ours", "rep": 1, "requests": [_request(0, 4100, 0, 4.0, 5.0), _request(1, 4200, 4080, 0.4, 1)]},
            {"server": "llama.cpp", "rep": 1, "requests": [_request(0, 4100, 0, 7.0, 8.0)]},
        ],
    }
    rows = replay.table(data)
    assert [r["request"] for r in rows] == [1, 2]
    assert rows[0]["ours"]["ttft_s"] == 3.0 and rows[0]["llama.cpp"]["ttft_s"] == 6.0
    assert rows[1]["ours"]["cached_tokens"] == 4080 and rows[1]["ours"]["repetitions"] == 2
    assert rows[1]["llama.cpp"]["repetitions"] == 1  # a repetition that ended early counts where it got to
    lines = replay.section({"agent_replay": data}, [], [])
    assert "claude-code 9.9.9" in lines[0] and "| 2 | 4200 / 4200 | 4080 | 4099 |" in "\n".join(lines)
    assert replay.section({"agent_replay": {"skipped": "no llama.cpp"}}, [], []) == []
    assert replay.summary_lines(data)[1].startswith("replay request 2: ours 4200 tokens (4080 cached)")
