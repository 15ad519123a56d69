"""Prefill and decode at agent depth, against llama.cpp's server on the same file (like `llama-bench -d`): per depth,
one stream of fresh random prompts of that many tokens (no prefix cache helps either side), `output_len` tokens
each. The prefill rate is the prompt over the time to its first token; the decode rate is one over the time per
output token, both at that depth. Both servers are restarted per repetition (start order alternating), each sized
for the deepest prompt that fits the model's context: llama.cpp with its defaults (one slot, f16 KV cache), the
service with what its policy decides but the KV cache's size (kv_cache_gib)."""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import servers as srv
from bench.context import Context, cache_dir, ours_ready, start
from bench.load import Workload
from bench.output import Output, log
from bench.parts.peer import FORMATS, USER_FILE, available, gguf_models, predicted_tokens, sides, start_llama
from bench.servers import SERVED
from bench.stats import PEER_ESTIMATES, Comparison, Estimate, compare
from harness import ServerProcess
from harness.models import SIZES, ensure_bench_model

# Room past prompt + answer: the client's random prompt can come out a few tokens longer once re-tokenized.
MARGIN = 64
PREFIX = "depth-"


@dataclass(frozen=True)
class DepthOptions:
    # FORMATS: the default model's own file (8k context) and the bench model's Q4_0 file at `size`
    format: tuple[str, ...] = ("smollm2-q4_1", "q4_0-gguf")
    file: str = ""  # a GGUF file of the user's instead (a Q4_K_M download, say)
    # The 1.5 B shape by default: the 0.5 B bench model's context is 1024 tokens, 1.5b's and 3b's their checkpoints'.
    size: str = "1.5b"
    # Prompt lengths in tokens; the first is the peer table's prompt (depth ~0). Those past the context are left out.
    at: tuple[int, ...] = (128, 4096, 16384, 32768)  # `--depth-at 4096`
    requests: int = 2  # per depth, side and repetition (one after the other: one stream)
    output_len: int = 64
    repetitions: int = 2
    # Variants of ours served beside the policy's choice, each compared with it at every depth (VARIANT_SETTINGS):
    # KV-cache types (`--depth-kv fp8`) and step sizes (`--depth-chunk 8192`, the chunk a long prompt is prefilled in).
    kv: tuple[str, ...] = ()
    chunk: tuple[int, ...] = ()
    # Model dtypes (`--depth-dtype bfloat16`): under an fp32 engine (AVX2 CPUs) the KV cache is cached in the dtype, so
    # bf16 halves the bytes a decode step reads at depth, where vLLM's CPU attention stores no smaller type.
    dtype: tuple[str, ...] = ()
    peer: bool = True  # `--no-depth-peer`: ours and its KV variants only (llama.cpp's deep prefill takes longest)


def fitting(depths: tuple[int, ...], context: int, output_len: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The depths whose prompt and answer fit a context of `context` tokens, and those that do not."""
    fits = tuple(d for d in depths if d + output_len + MARGIN <= context)
    return fits, tuple(d for d in depths if d not in fits)


def _config(model_dir: Path) -> dict[str, Any]:
    config: dict[str, Any] = json.loads((model_dir / "config.json").read_text())
    return dict(config.get("text_config") or config)


def context_of(model_dir: Path) -> int:
    """The model's context in tokens, as its config.json states it (what the service plans against)."""
    return int(_config(model_dir)["max_position_embeddings"])


def kv_cache_gib(model_dir: Path, tokens: int) -> int:
    """GiB of KV cache that hold one sequence of `tokens` in fp32 (the widest type the service caches), a quarter
    over: every server of the sweep gets this much, so that several fit the machine at once (the policy's default
    takes most of the free memory) and none is short of its deepest prompt."""
    c = _config(model_dir)
    head_dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    per_token = c["num_hidden_layers"] * c.get("num_key_value_heads", c["num_attention_heads"]) * head_dim * 2 * 4
    return max(1, math.ceil(int(per_token) * tokens * 1.25 / 1024**3))


def inverse(e: Estimate | None) -> tuple[float, float | None, float | None] | None:
    """A time ratio (ours/llama.cpp) as a speed ratio: its value and interval inverted."""
    if e is None:
        return None
    return 1 / e.value, 1 / e.high if e.high else None, 1 / e.low if e.low else None


def run(ctx: Context, options: DepthOptions) -> Output:
    why = available() if options.peer else None
    if why:
        log(f"depth skipped: {why}")
        return Output({"skipped": why})
    if options.file:
        base, formats = Path(options.file), [USER_FILE]
        generated = {USER_FILE: base}
    else:
        if options.size not in SIZES:
            raise SystemExit(f"--depth-size {options.size}: one of {', '.join(SIZES)}")
        unknown = [f for f in options.format if f not in FORMATS]
        if unknown:
            raise SystemExit(f"--depth-format {' '.join(unknown)}: one of {', '.join(FORMATS)}")
        base, formats = ensure_bench_model(cache_dir(), options.size), list(options.format)
        generated = gguf_models(base, formats, ctx.logdir / "gguf.log")
    out: dict[str, Any] = {
        "runs": [],
        "formats": {},
        "size": None if options.file else options.size,
        "llama_cpp_flags": srv.llama_cpp_flags() if options.peer else "",
        "output_len": options.output_len,
        "requests": options.requests,
    }
    comparisons: list[Comparison] = []
    for fmt in formats:
        paired = sides(fmt, base, generated)
        context = context_of(paired.tokenizer)
        depths, dropped = fitting(options.at, context, options.output_len)
        record = out["formats"][fmt] = {"gguf": str(paired.gguf), "context": context, "depths": list(depths)}
        if dropped:
            record["left_out"] = list(dropped)
            log(f"depth {fmt}: {', '.join(map(str, dropped))} tokens left out: past its {context}-token context")
        if not depths:
            continue
        ctx_len = max(depths) + options.output_len + MARGIN
        for rep in range(options.repetitions):
            _repetition(ctx, options, fmt, paired, depths, ctx_len, rep, out)
    comparisons = _comparisons(out["runs"])
    return Output(out, tuple(comparisons), summary=tuple(summary_lines(out, comparisons)))


# What each kind of variant sets, and what the decision resting on it is: service/policy/engine/kv_cache_dtype.py (the KV
# cache's storage type) and service/policy/engine/prefill_chunk.py (the tokens one engine step takes).
VARIANT_SETTINGS = {"kv": "SERVICE_KV_CACHE_DTYPE", "chunk": "SERVICE_MAX_NUM_BATCHED_TOKENS", "dtype": "SERVICE_DTYPE"}
VARIANT_LABELS = {"kv": "KV-cache type", "chunk": "tokens a step takes", "dtype": "model dtype"}
VARIANT_PREFIX = "ours-"


def variant(kind: str, value: object) -> str:
    """The server name of ours with `kind` (VARIANT_SETTINGS) set to `value`."""
    return f"{VARIANT_PREFIX}{kind}-{value}"


def variants(options: DepthOptions) -> list[tuple[str, dict[str, str]]]:
    """(server name, settings) of each variant the options ask for."""
    chosen: dict[str, tuple[object, ...]] = {"kv": options.kv, "chunk": options.chunk, "dtype": options.dtype}
    return [(variant(k, v), {VARIANT_SETTINGS[k]: str(v)}) for k, values in chosen.items() for v in values]


def _comparisons(runs: list[dict[str, Any]]) -> list[Comparison]:
    """Per depth: ours / llama.cpp, named depth-<format>-<depth>; and each variant / ours, named
    depth-<format>-<depth>/ours-<kind>-<value>. A depth whose runs of either side were left out has no comparison."""
    out = []
    for name in dict.fromkeys(r["comparison"] for r in runs):
        of_name = [r for r in runs if r["comparison"] == name]
        servers = {r["server"] for r in of_name}
        if {"ours", "llama.cpp"} <= servers:
            out.append(compare(name, "ours", "llama.cpp", 1, of_name, estimates=PEER_ESTIMATES))
        for other in sorted(s for s in servers if s.startswith(VARIANT_PREFIX) and "ours" in servers):
            out.append(compare(f"{name}/{other}", other, "ours", 1, of_name, estimates=PEER_ESTIMATES))
    return out


def _repetition(
    ctx: Context,
    options: DepthOptions,
    fmt: str,
    paired: Any,
    depths: tuple[int, ...],
    ctx_len: int,
    rep: int,
    out: dict[str, Any],
) -> None:
    """Both servers started (order alternating by repetition), warm; per depth one A/B pair of runs."""
    tokenizer = str(paired.tokenizer)
    cpus = ctx.reported.engine_cpus if ctx.reported else [0]
    live: list[ServerProcess] = []

    def llama() -> ServerProcess:
        log_path = ctx.logdir / f"server-{PREFIX}{fmt}-llama.cpp-rep{rep}.log"
        return start_llama(ctx, out, paired.gguf, cpus, 1, log_path, ctx_per_slot=ctx_len)

    sized = {
        "SERVICE_MAX_MODEL_LEN": str(ctx_len),
        "SERVICE_KV_CACHE_GIB": str(kv_cache_gib(paired.tokenizer, ctx_len)),
    }
    try:
        theirs = llama() if rep % 2 and options.peer else None
        if theirs:
            live.append(theirs)
        ours = start(
            srv.ours(
                str(paired.ours),
                SERVED,
                ctx.logdir / f"server-{PREFIX}{fmt}-ours-rep{rep}.log",
                {**sized, **paired.settings},
            ),
            ctx,
        )
        live.append(ours)
        ours_ready(ctx, lambda: None)(ours)
        others = []
        for name, setting in variants(options):
            log_path = ctx.logdir / f"server-{PREFIX}{fmt}-{name}-rep{rep}.log"
            others.append(
                (
                    name,
                    start(
                        srv.ours(str(paired.ours), SERVED, log_path, {**sized, **setting, **paired.settings}, name), ctx
                    ),
                )
            )
            live.append(others[-1][1])
        assert ctx.reported is not None
        out["formats"][fmt]["kv_read_per_token"] = ctx.reported.kv_read_per_token
        out["formats"][fmt]["read_per_token"] = ctx.reported.read_per_token
        cpus = ctx.reported.engine_cpus
        out.update(engine_cpus=cpus, threads=len(cpus))
        if theirs is None and options.peer:
            theirs = llama()
            live.append(theirs)
        pair = [("ours", ours), *others, *([("llama.cpp", theirs)] if theirs else [])]
        if rep % 2:
            pair.reverse()
        for _, proc in pair:  # warm, discarded
            ctx.load(Workload(1, 1, 128, 8, 999, fresh_connections=True), proc, tokenizer, SERVED)
        for depth in depths:
            name = f"{PREFIX}{fmt}-{depth}"
            w = Workload(1, options.requests, depth, options.output_len, 7000 * rep + depth, fresh_connections=True)
            try:
                for position, (who, proc) in enumerate(pair):
                    counter = functools.partial(predicted_tokens, proc.url) if who == "llama.cpp" else None
                    metrics, client = ctx.load(w, proc, tokenizer, SERVED, counter)
                    out["runs"].append(
                        {
                            "comparison": name,
                            "server": who,
                            "concurrency": 1,
                            "rep": rep,
                            "position": position,
                            "depth": depth,
                            "metrics": metrics,
                            "client": client,
                        }
                    )
                    log(
                        f"{name} rep {rep + 1} {who}: prefill {depth * 1000 / metrics['ttft_p50_ms']:.0f} tok/s "
                        f"(TTFT p50 {metrics['ttft_p50_ms']:.0f} ms), decode {1000 / metrics['tpot_p50_ms']:.1f} "
                        "tok/s"
                    )
            except RuntimeError as exc:  # a depth that fails is left out of this repetition; the others go on
                log(f"{name} rep {rep + 1}: {exc}; left out")
                out["runs"] = [r for r in out["runs"] if (r["comparison"], r["rep"]) != (name, rep)]
                out.setdefault("failed", []).append({"comparison": name, "rep": rep, "error": str(exc)})
    finally:
        for proc in live:
            proc.close()


def comparisons(results: dict[str, Any]) -> list[Comparison]:
    return _comparisons(results.get("depth", {}).get("runs", []))


def rows(data: dict[str, Any], comparisons: list[Comparison]) -> list[dict[str, Any]]:
    """Per format and depth: each side's prefill and decode rate (medians) and ours/llama.cpp as speed ratios."""
    by_name = {c.name: c for c in comparisons}
    out = []
    for fmt, record in data.get("formats", {}).items():
        for depth in record.get("depths", []):
            c = by_name.get(f"{PREFIX}{fmt}-{depth}")
            if c is None:
                continue
            ours, theirs = c.candidate_metrics, c.baseline_metrics
            kv = (record.get("kv_read_per_token") or {}).get(str(depth))
            out.append(
                {
                    "format": fmt,
                    "file": Path(record["gguf"]).name,
                    "depth": depth,
                    "prefill": (depth * 1000 / ours["ttft_p50_ms"], depth * 1000 / theirs["ttft_p50_ms"]),
                    "decode": (1000 / ours["tpot_p50_ms"], 1000 / theirs["tpot_p50_ms"]),
                    "prefill_ratio": inverse(c.estimates.get("ttft_p50_ms")),
                    "decode_ratio": inverse(c.estimates.get("tpot_p50_ms")),
                    "kv_read_mb": kv / 1e6 if kv else None,
                    "repetitions": c.repetitions,
                }
            )
    return out


def variant_rows(data: dict[str, Any], comparisons: list[Comparison]) -> list[dict[str, Any]]:
    """Per format, depth and variant: its prefill and decode against ours with the policy's choice, as speeds."""
    out = []
    for c in comparisons:
        name, _, other = c.name.partition("/")
        if not other:
            continue
        fmt, depth = name.removeprefix(PREFIX).rsplit("-", 1)
        kind, value = other.removeprefix(VARIANT_PREFIX).split("-", 1)
        out.append(
            {
                "format": fmt,
                "depth": int(depth),
                "kind": kind,
                "value": value,
                "prefill_ratio": inverse(c.estimates.get("ttft_p50_ms")),
                "decode_ratio": inverse(c.estimates.get("tpot_p50_ms")),
                "repetitions": c.repetitions,
            }
        )
    return out


def _ratio(r: tuple[float, float | None, float | None] | None) -> str:
    if r is None:
        return ""
    value, low, high = r
    return f"x{value:.2f}" + (f" [{low:.2f}, {high:.2f}]" if low is not None and high is not None else "")


def summary_lines(data: dict[str, Any], comparisons: list[Comparison]) -> list[str]:
    return [
        f"depth {r['format']} {r['depth']} tokens, ours/llama.cpp: prefill {_ratio(r['prefill_ratio'])}, decode "
        f"{_ratio(r['decode_ratio'])}"
        for r in rows(data, comparisons)
    ] + [
        f"depth {r['format']} {r['depth']} tokens, {VARIANT_LABELS[r['kind']]} {r['value']} / the policy's: prefill "
        f"{_ratio(r['prefill_ratio'])}, decode {_ratio(r['decode_ratio'])}"
        for r in variant_rows(data, comparisons)
    ]


def section(results: dict[str, Any], comparisons: list[Comparison], _decoded: list[Any]) -> list[str]:
    data = results["depth"]
    if data.get("skipped"):
        return [f"Depth: skipped ({data['skipped']}).", ""]
    lines = [
        f"Depth (like `llama-bench -d`): one stream of {data['requests']} fresh random prompts per depth, "
        f"{data['output_len']} output tokens each, on {data.get('threads')} compute thread(s) (CPUs "
        f"{data.get('engine_cpus')}) for both; llama-server with one slot and its default f16 KV cache, the service "
        "with its policy's choices. Prefill = prompt tokens / TTFT p50, decode = 1 / TPOT p50; ratios ours/llama.cpp "
        "as speeds (above 1: ours faster) with 95% intervals over restarts."
        + (f" llama.cpp built with `{data['llama_cpp_flags']}`." if data.get("llama_cpp_flags") else "")
        + (f" **{data['repack_off']}.**" if data.get("repack_off") else ""),
        "",
        "| file | depth | prefill tok/s ours / llama.cpp | prefill ratio | decode tok/s ours / llama.cpp | decode ratio "
        "| our KV read per step |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows(data, comparisons):
        kv = f"{r['kv_read_mb']:.0f} MB" if r["kv_read_mb"] is not None else ""
        lines.append(
            f"| {r['file']} ({r['format']}) | {r['depth']} | {r['prefill'][0]:.0f} / {r['prefill'][1]:.0f} | "
            f"{_ratio(r['prefill_ratio'])} | {r['decode'][0]:.1f} / {r['decode'][1]:.1f} | "
            f"{_ratio(r['decode_ratio'])} | {kv} |"
        )
    lines.append("")
    varied = variant_rows(data, comparisons)
    if varied:
        lines += [
            "Other settings, each served beside the policy's choice (`--depth-kv`, `--depth-chunk`, `--depth-dtype`), "
            "as speeds against it:",
            "",
            "| file | depth | setting | value | prefill ratio | decode ratio |",
            "| --- | --- | --- | --- | --- | --- |",
            *(
                f"| {r['format']} | {r['depth']} | {VARIANT_LABELS[r['kind']]} | {r['value']} | "
                f"{_ratio(r['prefill_ratio'])} | "
                f"{_ratio(r['decode_ratio'])} |"
                for r in varied
            ),
            "",
        ]
    for fmt, record in data.get("formats", {}).items():
        if record.get("left_out"):
            lines += [
                f"Left out for {fmt}: depths {record['left_out']}, past its {record['context']}-token context.",
                "",
            ]
    for failed in data.get("failed", []):
        lines += [f"Left out: {failed['comparison']} repetition {failed['rep'] + 1}: {failed['error']}", ""]
    return lines
