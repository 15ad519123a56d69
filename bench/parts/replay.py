"""A recorded agent session (harness/agent_session.py: Claude Code's requests, turn after turn, as the agent clients'
test recorded them) replayed against ours and llama.cpp's server on the same GGUF file, one compute thread each. Per
request: the time to its first token and to its end, the prompt tokens the server counted, and how many of them it
computed (the rest it found cached: the prefix an agent re-sends every turn). Each server starts fresh per repetition
(start order alternating), so a session's first request finds nothing cached; the requests go in the recorded order,
one at a time, to one server and then to the other.

What is replayed of each request: its system prompt and messages, greedy, its answer capped at `max_tokens` (the
prompts are the session's weight; random weights or a small model would otherwise write on). Claude Code's extensions
that are no part of the prompt (thinking budget, context management, output config, metadata) are left out, and so are
the thinking blocks of earlier answers. The tool list is left out unless `tools` is set: the default file's template
(SmolLM2's) renders none, where llama.cpp would render them its own generic way, so the two servers would no longer
see the same prompt."""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench import servers as srv
from bench.context import Context, ours_ready, start
from bench.output import Output, log
from bench.parts.depth import context_of
from bench.parts.peer import USER_FILE, available, sides, start_llama
from bench.servers import SERVED
from harness import ServerProcess, agent_session
from harness.metrics import counter_totals

DEFAULT_FILE = "smollm2-q4_1"  # the peer format (bench/parts/peer.py FORMATS) of the packaged default model's file
# Left out of every replayed request: no part of the prompt, and not every server takes them.
NOT_PROMPT = ("thinking", "context_management", "output_config", "metadata")
# The counters of the prompt tokens each server computed, and of those it found cached.
OURS_CACHED = "vllm:prefix_cache_hits_total"
LLAMA_COMPUTED = "llamacpp:prompt_tokens_total"


@dataclass(frozen=True)
class ReplayOptions:
    session: str = ""  # a recorded session file; "" for the newest one kept in bench/requests/
    file: str = ""  # a GGUF file of the user's; "" for the packaged default model's own file
    repetitions: int = 2
    max_tokens: int = 32
    tools: bool = False  # keep the tool list: for a file whose template renders tools


def kept_session() -> Path:
    found = sorted(agent_session.KEPT.glob(agent_session.file_name("claude-code", "*")))
    if not found:
        raise SystemExit(f"no recorded Claude Code session in {agent_session.KEPT}")
    return found[-1]


def replayed(body: dict[str, Any], max_tokens: int, tools: bool) -> dict[str, Any]:
    """The recorded request as it is replayed (the module's docstring says what changes and why)."""
    out = {k: v for k, v in body.items() if k not in NOT_PROMPT and (tools or k not in ("tools", "tool_choice"))}
    out["messages"] = [_without_thinking(m) for m in body["messages"]]
    out.update(model=SERVED, max_tokens=min(int(body.get("max_tokens", max_tokens)), max_tokens), stream=True)
    return out | {"temperature": 0}


def _without_thinking(message: dict[str, Any]) -> dict[str, Any]:
    content = message.get("content")
    if not isinstance(content, list):
        return message
    return message | {"content": [b for b in content if b.get("type") not in ("thinking", "redacted_thinking")]}


def send(url: str, body: dict[str, Any]) -> dict[str, Any]:
    """One streamed request: seconds to the first text and to the end, and the usage the server reported."""
    started = time.monotonic()
    first: float | None = None
    usage: dict[str, int] = {}
    with httpx.stream("POST", f"{url}/v1/messages", json=body, timeout=3600) as reply:
        if reply.status_code != 200:
            raise RuntimeError(f"{reply.status_code}: {reply.read().decode(errors='replace')[:500]}")
        for line in reply.iter_lines():
            if not line.startswith("data:"):
                continue
            event = json.loads(line[len("data:") :])
            if first is None and event.get("type") == "content_block_delta":
                first = time.monotonic() - started
            for found in (event.get("usage"), (event.get("message") or {}).get("usage")):
                for key, value in (found or {}).items():
                    if isinstance(value, int):
                        usage[key] = max(usage.get(key, 0), value)
    total = time.monotonic() - started
    return {"ttft_s": first if first is not None else total, "total_s": total, "usage": usage}


def computed(who: str, url: str) -> float:
    """The server's running count of prompt tokens it computed (ours: by the cached ones, subtracted later)."""
    name = OURS_CACHED if who == "ours" else LLAMA_COMPUTED
    totals = counter_totals(url, name.removesuffix("_total"))
    if name not in totals:
        raise RuntimeError(f"{url}/metrics has no {name}")
    return totals[name]


def play(who: str, server: ServerProcess, bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    answers = []
    for i, body in enumerate(bodies):
        before = computed(who, server.url)
        answer = send(server.url, body)
        counted = computed(who, server.url) - before
        usage = answer["usage"]
        prompt = usage.get("input_tokens", 0) + usage.get("cache_read_input_tokens", 0)
        prompt += usage.get("cache_creation_input_tokens", 0)
        cached = counted if who == "ours" else max(0.0, prompt - counted)
        answers.append(answer | {"request": i, "prompt_tokens": prompt, "cached_tokens": int(cached)})
        log(
            f"replay {who} request {i + 1}: {prompt} prompt tokens ({int(cached)} cached), first token after "
            f"{answer['ttft_s']:.2f} s, done after {answer['total_s']:.2f} s"
        )
    return answers


def run(ctx: Context, options: ReplayOptions) -> Output:
    if why := available():
        log(f"replay skipped: {why}")
        return Output({"skipped": why})
    path = Path(options.session) if options.session else kept_session()
    session = agent_session.load(path)
    fmt = USER_FILE if options.file else DEFAULT_FILE
    paired = sides(fmt, Path(), {USER_FILE: Path(options.file)} if options.file else {})
    bodies = [replayed(r["body"], options.max_tokens, options.tools) for r in session.requests]
    out: dict[str, Any] = {
        "session": path.name,
        "client": f"{session.client} {session.version}",
        "gguf": str(paired.gguf),
        "format": fmt,
        "max_tokens": options.max_tokens,
        "tools": options.tools,
        "llama_cpp_flags": srv.llama_cpp_flags(),
        "runs": [],
    }
    for rep in range(options.repetitions):
        for who in ("ours", "llama.cpp")[:: 1 if rep % 2 == 0 else -1]:
            server = _server(ctx, out, who, paired, rep)
            try:
                out["runs"].append({"server": who, "rep": rep, "requests": play(who, server, bodies)})
            finally:
                server.close()
    return Output(out, summary=tuple(summary_lines(out)))


def _server(ctx: Context, out: dict[str, Any], who: str, paired: Any, rep: int) -> ServerProcess:
    log_path = ctx.logdir / f"server-replay-{who}-rep{rep}.log"
    if who == "llama.cpp":
        cpus = ctx.reported.engine_cpus if ctx.reported else [0]
        return start_llama(ctx, out, paired.gguf, cpus, 1, log_path, ctx_per_slot=context_of(Path(paired.tokenizer)))
    server = start(srv.ours(str(paired.ours), SERVED, log_path, paired.settings), ctx)
    ours_ready(ctx, lambda: None)(server)
    assert ctx.reported is not None
    out.update(engine_cpus=ctx.reported.engine_cpus, threads=len(ctx.reported.engine_cpus))
    return server


def table(data: dict[str, Any]) -> list[dict[str, Any]]:
    """Per request and server: the median over repetitions of its times, its prompt and cached tokens."""
    rows = []
    count = max((len(r["requests"]) for r in data["runs"]), default=0)
    for i in range(count):
        row: dict[str, Any] = {"request": i + 1}
        for who in ("ours", "llama.cpp"):
            seen = [r["requests"][i] for r in data["runs"] if r["server"] == who and len(r["requests"]) > i]
            if seen:
                row[who] = {
                    "prompt_tokens": seen[0]["prompt_tokens"],
                    "cached_tokens": min(s["cached_tokens"] for s in seen),
                    "ttft_s": statistics.median([s["ttft_s"] for s in seen]),
                    "total_s": statistics.median([s["total_s"] for s in seen]),
                    "repetitions": len(seen),
                }
        rows.append(row)
    return rows


def summary_lines(data: dict[str, Any]) -> list[str]:
    lines = []
    for row in table(data):
        parts = [
            f"{who} {r['prompt_tokens']} tokens ({r['cached_tokens']} cached) TTFT {r['ttft_s']:.2f} s, "
            f"end {r['total_s']:.2f} s"
            for who in ("ours", "llama.cpp")
            if (r := row.get(who))
        ]
        lines.append(f"replay request {row['request']}: " + "; ".join(parts))
    return lines


def section(results: dict[str, Any], _comparisons: list[Any], _decoded: list[Any]) -> list[str]:
    data = results.get("agent_replay")
    if not data or "runs" not in data:
        return []
    lines = [
        f"## A recorded agent session replayed ({data['client']}, {data['session']})",
        "",
        f"On {Path(data['gguf']).name}, {data.get('threads', '?')} compute thread(s) each, answers capped at "
        f"{data['max_tokens']} tokens, tools {'kept' if data['tools'] else 'left out'}; medians over the "
        "repetitions (each a fresh start of both servers). Cached: the prompt tokens the server did not compute "
        "(the fewest of any repetition).",
        "",
        "| request | prompt tokens | cached, ours | cached, llama.cpp | TTFT ours | TTFT llama.cpp | end ours "
        "| end llama.cpp |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in table(data):
        ours, theirs = row.get("ours") or {}, row.get("llama.cpp") or {}
        lines.append(
            f"| {row['request']} | {ours.get('prompt_tokens', '-')} / {theirs.get('prompt_tokens', '-')} "
            f"| {ours.get('cached_tokens', '-')} | {theirs.get('cached_tokens', '-')} "
            f"| {_s(ours.get('ttft_s'))} | {_s(theirs.get('ttft_s'))} | {_s(ours.get('total_s'))} "
            f"| {_s(theirs.get('total_s'))} |"
        )
    return [*lines, ""]


def _s(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.2f} s"
