"""llama.cpp's server as the peer: the bench model (and its quantized copies) as GGUF, served by `llama-server` with the
engine's compute cores as its threads and one parallel slot per concurrent request, against our service on the same
weights, with the same load and the same paired, restarted, interleaved method as the front-end comparison."""

from __future__ import annotations

import functools
import os
import random
import subprocess
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx

from bench import servers as srv
from bench.context import LOAD_CRASHES, REPACK_OFF, Context, cache_dir, ours_ready, start
from bench.load import Workload
from bench.output import Output, log
from bench.parts import speculative
from bench.profile import step_line
from bench.servers import CTX_PER_SLOT, SERVED, llama_server
from bench.servers import LLAMA_CPP_BIN as BIN
from bench.stats import PEER_ESTIMATES, Comparison, DecodeResult, compare, decode_line, estimate, summary_line
from bench.tables import PEER_COLUMNS, comparison_table, decode_table
from harness import REPO, ServerProcess
from harness.models import DEFAULT_SIZE, SIZES, ensure_bench_model
from harness.quantized_models import quantized_bench

LLAMA_CPP_VERSION = "0.3.36"  # mk/bench.mk's LLAMA_CPP_VERSION
TREE = REPO / ".cache" / "bench-src" / f"llama_cpp_python-{LLAMA_CPP_VERSION}" / "vendor" / "llama.cpp"

# format -> (the service's model: None = the bf16 bench model, GGUF = llama.cpp's own file, else
#            harness/quantized_models.py's scheme; llama.cpp's GGUF type). Q8_0: int8 blocks of 32 with an fp16
# scale, vs W8A8 (int8 per channel, int8 dynamic activations); Q4_0: int4 blocks of 32, vs W4A16 (int4 groups of
# 128, bf16 activations). The -gguf formats: both servers load the one file (the service keeps its blocks);
# smollm2-q4_1: the same for the packaged default model's own Q4_1 file (SmolLM2-135M-Instruct).
GGUF, DEFAULT_GGUF, USER_FILE = "gguf", "default-gguf", "file"
FORMATS: dict[str, tuple[str | None, str]] = {
    "bf16": (None, "BF16"),
    "q8_0": ("w8a8", "Q8_0"),
    "q4_0": ("w4a16", "Q4_0"),
    "q8_0-gguf": (GGUF, "Q8_0"),
    "q4_0-gguf": (GGUF, "Q4_0"),
    "q4_1-gguf": (GGUF, "Q4_1"),  # int4 blocks of 32 with a minimum: AWQ-like zero points; ggml does not repack it
    "q4_k_m-gguf": (GGUF, "Q4_K_M"),  # the common download: Q4_K, some layers' attn_v and ffn_down in Q6_K
    "smollm2-q4_1": (DEFAULT_GGUF, "Q4_1"),
}
# Formats where both servers load the same file: their greedy answers are compared before the load (`agreement`).
SAME_FILE = (GGUF, DEFAULT_GGUF)
# The files speculative decoding is measured on: the default model's own (real text, real acceptance) and the bench
# model's 4- and 8-bit files (random weights: what drafting costs and gains on a larger decoder).
SPECULATIVE_FORMATS = ("smollm2-q4_1", "q4_0-gguf", "q8_0-gguf")
# Simple prompts with one plain continuation each: a wrong mapping shows in the first words (a day repeated, a special
# token repeated), where a near-tie of two right answers would not.
AGREEMENT_PROMPTS = (
    "Monday, Tuesday, Wednesday,",
    "The capital of France is",
    "1, 2, 3, 4, 5,",
    "The opposite of hot is",
    "January, February, March,",
    "Water is made of hydrogen and",
)
AGREEMENT_TOKENS = 16
AGREEMENT_IDS = 6  # a prompt agrees where both servers' first 6 generated token ids are the same
AGREEMENT_WORDS = 4  # and, as text: the first 4 words

# The converter hashes the tokenizer's output on a test string to name its pre-tokenizer and refuses hashes it does
# not know. The bench model's tokenizer is a byte-level BPE with GPT-2's split regex (service/models/demo_model.py), which is
# llama.cpp's "gpt-2"; the tokenization check below verifies both servers count the same prompt tokens.
_CONVERT = r"""
import runpy, sys
tree, model, out = sys.argv[1:4]
sys.path[:0] = [tree, tree + "/gguf-py"]
from conversion.base import TextModel
TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
sys.argv = ["convert_hf_to_gguf.py", model, "--outtype", "bf16", "--outfile", out]
runpy.run_path(tree + "/convert_hf_to_gguf.py", run_name="__main__")
"""


def available() -> str | None:
    """Why the peer cannot run, or None."""
    missing = [
        p for p in (BIN / "llama-server", BIN / "llama-quantize", TREE / "convert_hf_to_gguf.py") if not p.exists()
    ]
    return (
        f"llama.cpp not built ({', '.join(str(p.relative_to(REPO)) for p in missing)}): run `make bench-tools`"
        if missing
        else None
    )


def gguf_models(source: Path, formats: list[str], log: Path) -> dict[str, Path]:
    """bf16 GGUF by llama.cpp's converter, the others by llama-quantize from it (cached next to the source model)."""
    out: dict[str, Path] = {}
    bf16 = source.parent / f"{source.name}.bf16.gguf"
    if not bf16.exists():
        with open(log, "ab") as f:
            subprocess.run(
                [sys.executable, "-c", _CONVERT, str(TREE), str(source), str(bf16) + ".tmp"],
                check=True,
                stdout=f,
                stderr=subprocess.STDOUT,
                env={**os.environ, "NO_LOCAL_GGUF": ""},
            )
        os.replace(str(bf16) + ".tmp", bf16)
    for fmt in formats:
        if FORMATS[fmt][0] == DEFAULT_GGUF:  # llama.cpp loads the packaged file itself
            continue
        gtype = FORMATS[fmt][1]
        path = bf16 if gtype == "BF16" else source.parent / f"{source.name}.{gtype.lower()}.gguf"
        if not path.exists():
            with open(log, "ab") as f:
                # --pure: every tensor in the one type (llama-quantize otherwise keeps output.weight at Q6_K/Q8_0);
                # a mix (Q4_K_M) is llama-quantize's own recipe.
                pure = [] if gtype.endswith(("_M", "_S", "_L")) else ["--pure"]
                subprocess.run(
                    [str(BIN / "llama-quantize"), *pure, str(bf16), str(path) + ".tmp", gtype, "1"],
                    check=True,
                    stdout=f,
                    stderr=subprocess.STDOUT,
                )
            os.replace(str(path) + ".tmp", path)
        out[fmt] = path
    return out


@dataclass(frozen=True)
class Sides:
    """What each server of one format loads."""

    ours: Path  # the service's model (directory or GGUF file)
    gguf: Path  # llama-server's file
    tokenizer: Path  # the client's (and the tokenization check's) tokenizer directory
    settings: dict[str, str]  # the service's settings beyond the bench's


def sides(fmt: str, base: Path, generated: dict[str, Path]) -> Sides:
    if fmt == USER_FILE:
        return user_file_sides(generated[fmt])
    kind = FORMATS[fmt][0]
    if kind == DEFAULT_GGUF:
        file, converted = default_model_files()
        return Sides(file, file, converted, {"SERVICE_GGUF_BLOCKS": "on"})
    if kind is None:
        return Sides(base, generated[fmt], base, {})
    ours = generated[fmt] if kind == GGUF else quantized_bench(cache_dir(), kind)
    return Sides(ours, generated[fmt], base, {})


def default_model_files() -> tuple[Path, Path]:
    """The packaged default model's GGUF file, and its dequantized copy (its tokenizer as the service builds it)."""
    from service.settings import Settings

    return _converted(Settings(cache_dir=cache_dir(), dtype="float32", gguf_blocks="off"), "the packaged default model")


def user_file_sides(file: Path) -> Sides:
    """A GGUF file the user named: both servers load it, the service with its own choices (its blocks kept where it
    keeps them); the client's tokenizer is the one the service's conversion of the file builds."""
    from service.settings import Settings

    source, converted = _converted(Settings(cache_dir=cache_dir(), model=str(file.resolve())), str(file))
    return Sides(source, source, converted, {})


def _converted(settings: Any, what: str) -> tuple[Path, Path]:
    """The GGUF file the service plans to serve under `settings`, and its conversion (made here, cached for the
    service): a file the service refuses fails here, with the service's reason."""
    from service.models.gguf_convert import ensure_converted
    from service.startup import build_report
    from service.startup.model_sources import choose_model

    report = build_report(settings, model=choose_model(settings, build_demo=False))
    if report.errors:
        raise RuntimeError(f"the service refuses {what}: {'; '.join(report.errors)}")
    plan = report.plan.model
    if plan is None or plan.conversion is None:
        raise RuntimeError(f"{what} is not a GGUF file the service converts (for the packaged one: `make setup`)")
    return Path(plan.conversion.source), ensure_converted(plan.conversion)


def gguf_bytes_per_token(path: Path) -> int:
    """Weight bytes one decode step reads from a GGUF: every tensor but the token-embedding table (one row read),
    unless the file has no `output.weight`: then llama.cpp reads the table whole as the output head (tied)."""
    sys.path.insert(0, str(TREE / "gguf-py"))
    try:
        from gguf import GGUFReader
    finally:
        sys.path.pop(0)
    tensors = GGUFReader(str(path)).tensors
    tied = not any(t.name == "output.weight" for t in tensors)
    return sum(int(t.n_bytes) for t in tensors if tied or t.name != "token_embd.weight")


def start_llama(
    ctx: Context,
    peer: dict[str, Any],
    gguf: Path,
    cpus: list[int],
    slots: int,
    log_path: Path,
    ctx_per_slot: int = CTX_PER_SLOT,
) -> ServerProcess:
    """llama-server, started. One that dies of SIGILL or SIGSEGV while it loads with its weight repacking on (on Intel
    guests with AMX its AMX kernel did: `tilezero` raised SIGILL on one, a general protection fault in libggml-cpu on
    another) is started again with repacking off (LLAMA_ARG_REPACK=0, which keeps it off those kernels and off its
    repacked AVX-512 layouts too), as is every later llama-server of the run: a fallback the table names. A user's own
    LLAMA_ARG_REPACK is left as it is."""
    off = peer.get("repack_off")
    server = llama_server(gguf, cpus, slots, log_path, REPACK_OFF if off else None, ctx_per_slot=ctx_per_slot)
    try:
        return start(server, ctx)
    except RuntimeError:
        code = server.proc.returncode if server.proc is not None else None
        if off or "LLAMA_ARG_REPACK" in os.environ or code not in LOAD_CRASHES:
            raise
    peer["repack_off"] = (
        f"llama-server died of {LOAD_CRASHES[code]} loading {gguf.name} with its weight repacking on, so it and every "
        "llama-server after it in this run ran with repacking off (LLAMA_ARG_REPACK=0): off its repacked (AVX-512, "
        "AMX) kernels, which flatters ours"
    )
    log(f"peer: {peer['repack_off']}")
    return start(llama_server(gguf, cpus, slots, log_path, REPACK_OFF, ctx_per_slot=ctx_per_slot), ctx)


def predicted_tokens(url: str) -> float:
    """llama-server's own count of generated tokens (`llamacpp:tokens_predicted_total` at /metrics)."""
    for line in httpx.get(url + "/metrics", timeout=30).text.splitlines():
        if line.startswith("llamacpp:tokens_predicted_total "):
            return float(line.split()[1])
    raise RuntimeError(f"{url}/metrics has no llamacpp:tokens_predicted_total")


def tokenization(ours_url: str, llama_url: str, tokenizer_dir: str, n: int = 8) -> dict[str, Any]:
    """Prompts made as the benchmark client makes them (random token ids, decoded): the prompt tokens each server
    counts (usage.prompt_tokens of a 1-token completion) must be equal."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    rng = random.Random(0)
    special = set(tok.all_special_ids)
    ids = [i for i in range(tok.vocab_size) if i not in special]
    counts = []
    for _ in range(n):
        text = tok.decode([rng.choice(ids) for _ in range(64)])
        body = {"model": SERVED, "prompt": text, "max_tokens": 1, "temperature": 0}
        a = httpx.post(ours_url + "/v1/completions", json=body, timeout=120).json()["usage"]["prompt_tokens"]
        b = httpx.post(llama_url + "/v1/completions", json=body, timeout=120).json()["usage"]["prompt_tokens"]
        counts.append((a, b))
    same = all(a == b for a, b in counts)
    return {
        "same": same,
        "prompt_tokens": counts,
        "line": f"{'same' if same else 'DIFFERENT'} prompt token counts on {n} random prompts "
        f"(ours, llama.cpp): {counts[:4]}{' ...' if n > 4 else ''}",
    }


def first_words(text: str) -> list[str]:
    return text.split()[:AGREEMENT_WORDS]


def agreement(ours_url: str, llama_url: str) -> dict[str, Any]:
    """Both servers' greedy continuations of AGREEMENT_PROMPTS on the same file: a prompt agrees where their first
    AGREEMENT_IDS generated token ids are the same. A wrong mapping of the file shows here before any throughput is
    measured. The texts are compared too (the first AGREEMENT_WORDS words), but they can differ on the same tokens:
    llama.cpp renders a token the file marks unused (the bench model's [PAD...] tokens) as nothing, the service
    as its text."""
    rows = []
    for prompt in AGREEMENT_PROMPTS:
        body = {"model": SERVED, "prompt": prompt, "max_tokens": AGREEMENT_TOKENS, "temperature": 0}
        ours = httpx.post(ours_url + "/v1/completions", json=body | {"return_token_ids": True}, timeout=300)
        # llama-server's own endpoint: its OpenAI one returns no token ids
        native = {"prompt": prompt, "n_predict": AGREEMENT_TOKENS, "temperature": 0, "return_tokens": True}
        llama = httpx.post(llama_url + "/completion", json=native, timeout=300)
        choice, theirs = ours.raise_for_status().json()["choices"][0], llama.raise_for_status().json()
        ids = {"ours": choice["token_ids"], "llama.cpp": theirs["tokens"]}
        rows.append(
            {
                "prompt": prompt,
                "ours": choice["text"],
                "llama.cpp": theirs["content"],
                "ids": ids,
                "same": ids["ours"][:AGREEMENT_IDS] == ids["llama.cpp"][:AGREEMENT_IDS],
                "same_words": first_words(choice["text"]) == first_words(theirs["content"]),
            }
        )
    agreed, worded = sum(r["same"] for r in rows), sum(r["same_words"] for r in rows)
    example = next(
        (
            f"; first to differ: {r['prompt']!r} -> ours {r['ids']['ours'][:AGREEMENT_IDS]} {r['ours']!r}, llama.cpp "
            f"{r['ids']['llama.cpp'][:AGREEMENT_IDS]} {r['llama.cpp']!r}"
            for r in rows
            if not r["same"]
        ),
        "",
    )
    return {
        "agreed": agreed,
        "agreed_words": worded,
        "prompts": rows,
        "line": f"{agreed} of {len(rows)} prompts with the same first {AGREEMENT_IDS} tokens (greedy, "
        f"{AGREEMENT_TOKENS} tokens), {worded} with the same first {AGREEMENT_WORDS} words{example}",
    }


@dataclass(frozen=True)
class PeerOptions:
    format: tuple[str, ...] = ("bf16", "q8_0", "q4_0")  # FORMATS
    # A GGUF file of the user's: both servers load it (the service with its own choices), instead of the formats.
    file: str = ""
    # The bench model's decoder shape (harness/models.SIZES): the size sweep runs the formats at 1.5b and 3b.
    size: str = DEFAULT_SIZE
    repetitions: int = 2
    rounds: int = 1
    input_len: int = 128
    output_len: int = 32
    prompts: dict[int, int] = field(default_factory=lambda: {1: 4, 4: 8, 16: 32})
    # Speculative decoding (bench/parts/speculative.py) on these files: the service with n-gram drafting against llama.cpp's
    # server with its prompt lookup, each also without, on repeated text and free generation. A --peer-file run
    # measures the user's file instead. Requests per workload, concurrency and repetition; 0 leaves it out.
    speculative: tuple[str, ...] = SPECULATIVE_FORMATS
    speculative_requests: int = 3
    speculative_concurrency: tuple[int, ...] = (1, 4)
    # Suffix decoding beside them, against llama.cpp's ngram-mod: both remember earlier requests.
    speculative_suffix: bool = False


def run(ctx: Context, options: PeerOptions) -> Output:
    """Per format and repetition: our service started (start order alternating with llama-server), warm; per
    concurrency a llama-server with that many slots, warm; then A/B x rounds on the same workload."""
    from bench.bandwidth import read_bandwidth

    why = available()
    if why:
        log(f"peer skipped: {why}")
        return Output({"skipped": why})
    opts = ctx.opts
    if options.file:
        base, formats = Path(options.file), [USER_FILE]
        generated = {USER_FILE: base}
    else:
        if options.size not in SIZES:
            raise SystemExit(f"--peer-size {options.size}: one of {', '.join(SIZES)}")
        base, formats = ensure_bench_model(cache_dir(), options.size), list(options.format)
        generated = gguf_models(base, formats, ctx.logdir / "gguf.log")
    paired = {fmt: sides(fmt, base, generated) for fmt in formats}
    ggufs = {fmt: paired[fmt].gguf for fmt in formats}
    peer: dict[str, Any] = {
        "model": str(base),
        "size": None if options.file else options.size,
        "llama_server": f"llama.cpp from llama-cpp-python {LLAMA_CPP_VERSION}",
        "runs": [],
        "decode": [],
        "formats": {},
    }

    def w_of(c: int, rep: int, rnd: int) -> Workload:
        return Workload(
            c,
            options.prompts.get(c, 2 * c),
            options.input_len,
            options.output_len,
            seed=3000 * rep + 10 * rnd + c,
            fresh_connections=True,
        )

    comparisons: list[Comparison] = []
    for fmt in formats:
        model, tokenizer = str(paired[fmt].ours), str(paired[fmt].tokenizer)
        peer["formats"][fmt] = {"service_model": model, "gguf": str(ggufs[fmt])}
        name = f"peer-{fmt}"
        for rep in range(options.repetitions):
            ours_first = rep % 2 == 0
            live: list[ServerProcess] = []
            try:

                def llama_log(c: int, name: str = name, rep: int = rep) -> Path:
                    return ctx.logdir / f"server-{name}-llama.cpp-rep{rep}-c{c}.log"

                first_llama = None
                if not ours_first:  # llama.cpp started first this repetition
                    cpus = ctx.reported.engine_cpus if ctx.reported else [0]
                    first_llama = start_llama(
                        ctx, peer, ggufs[fmt], cpus, opts.concurrencies[0], llama_log(opts.concurrencies[0])
                    )
                    live.append(first_llama)
                ours = start(
                    srv.ours(
                        model,
                        SERVED,
                        ctx.logdir / f"server-{name}-ours-rep{rep}.log",
                        # The context llama.cpp gets per slot: a file made for 32k tokens needs no more here.
                        {
                            "SERVICE_KV_CACHE_GIB": "1",
                            "SERVICE_MAX_MODEL_LEN": str(CTX_PER_SLOT),
                            **paired[fmt].settings,
                        },
                    ),
                    ctx,
                )
                live.append(ours)
                ours_ready(ctx, lambda: None)(ours)
                assert ctx.reported is not None  # set by the hook
                # What one decode step reads as the service holds the weights (its dtype may not be the file's).
                peer["formats"][fmt]["read_per_token"] = ctx.reported.read_per_token
                # What ours ran is part of the result: a calibration may choose another kernel than the table's.
                peer["formats"][fmt]["kernel"] = ctx.reported.linear_kernel
                cpus = ctx.reported.engine_cpus
                peer.update(engine_cpus=cpus, threads=len(cpus))
                for c in opts.concurrencies:
                    llama = first_llama if (first_llama and c == opts.concurrencies[0]) else None
                    if llama is None:
                        llama = start_llama(ctx, peer, ggufs[fmt], cpus, c, llama_log(c))
                        live.append(llama)
                    if rep == 0 and c == opts.concurrencies[0]:
                        check = tokenization(ours.url, llama.url, tokenizer)
                        peer.setdefault("tokenization_by_format", {})[fmt] = check
                        peer["tokenization"] = check["line"]
                        log(f"peer {fmt} tokenization: {check['line']}")
                        if fmt == USER_FILE or FORMATS[fmt][0] in SAME_FILE:
                            agreed = agreement(ours.url, llama.url)
                            peer["formats"][fmt]["agreement"] = agreed
                            log(f"peer {fmt} greedy agreement: {agreed['line']}")
                    pair = [("ours", ours), ("llama.cpp", llama)]
                    if not ours_first:
                        pair.reverse()
                    # A cell that fails (a request the client could not send or read; see llama_server and Workload) is
                    # recorded and left out of the table; the rest of the bench goes on.
                    try:
                        for _, proc in pair:  # warm, discarded
                            ctx.load(
                                Workload(c, c, options.input_len, options.output_len, 999, fresh_connections=True),
                                proc,
                                tokenizer,
                                SERVED,
                            )
                        for rnd in range(options.rounds):
                            w = w_of(c, rep, rnd)
                            for position, (who, proc) in enumerate(pair):
                                counter = functools.partial(predicted_tokens, proc.url) if who == "llama.cpp" else None
                                metrics, client = ctx.load(w, proc, tokenizer, SERVED, counter)
                                peer["runs"].append(
                                    {
                                        "comparison": name,
                                        "server": who,
                                        "concurrency": c,
                                        "rep": rep,
                                        "round": rnd,
                                        "position": position,
                                        "workload": w.__dict__,
                                        "metrics": metrics,
                                        "client": client,
                                        "loadavg_1m": os.getloadavg()[0],
                                    }
                                )
                                log(
                                    f"{name} rep {rep + 1} c={c} {who}: {metrics['output_throughput']:.1f} tok/s, TTFT p50 "
                                    f"{metrics['ttft_p50_ms']:.0f} ms, TPOT p50 {metrics['tpot_p50_ms']:.1f} ms; load {os.getloadavg()[0]:.1f}"
                                )
                        if opts.profile and rep == 0 and c == 1:  # one more, uncounted run of ours
                            peer["formats"][fmt]["profile"] = _profile_ours(ours, w_of(c, rep, 0), ctx, tokenizer, fmt)
                    except RuntimeError as exc:
                        log(f"{name} rep {rep + 1} c={c}: {exc}; cell left out")
                        peer["runs"] = [
                            r for r in peer["runs"] if (r["comparison"], r["concurrency"], r["rep"]) != (name, c, rep)
                        ]
                        peer.setdefault("failed", []).append(
                            {"comparison": name, "concurrency": c, "rep": rep, "error": str(exc)}
                        )
                    llama.close()  # the next concurrency gets a server with its own slot count
                    live.remove(llama)
            finally:
                for proc in live:
                    proc.close()
        runs = [r for r in peer["runs"] if r["comparison"] == name]
        comparisons += [
            compare(name, "ours", "llama.cpp", c, runs, estimates=PEER_ESTIMATES)
            for c in opts.concurrencies
            if {r["server"] for r in runs if r["concurrency"] == c} == {"ours", "llama.cpp"}
        ]
    # Batch-1 decode of each side against the bandwidth ceiling (c=1 runs' TPOT p50, medians).
    lines = []
    if options.speculative_requests > 0:
        # the same llama.cpp as the table's: where its repacking crashed there, the speculation's starts with it off
        peer["speculative"] = speculation(ctx, options, base, REPACK_OFF if peer.get("repack_off") else None)
        lines += speculation_lines(peer["speculative"])
    if 1 in opts.concurrencies and ctx.reported:
        bw = read_bandwidth(ctx.reported.engine_cpus)
        peer["bandwidth"] = bw
        for fmt in formats:
            c1 = next((c for c in comparisons if c.name == f"peer-{fmt}" and c.concurrency == 1), None)
            if c1 is None:
                continue
            for who, metrics, nbytes in (
                (f"ours {fmt}", c1.candidate_metrics, peer["formats"][fmt].get("read_per_token")),
                (f"llama.cpp {fmt}", c1.baseline_metrics, gguf_bytes_per_token(ggufs[fmt])),
            ):
                if not nbytes:  # a report without the figure (a model without safetensors headers)
                    continue
                d = DecodeResult(who, metrics["tpot_p50_ms"], bw["gbs"], nbytes)
                peer["decode"].append(
                    {
                        "dtype": d.dtype,
                        "tpot_p50_ms": d.tpot_p50_ms,
                        "bandwidth_gbs": d.bandwidth_gbs,
                        "bytes_per_token": d.bytes_per_token,
                    }
                )
                lines.append(decode_line(d))
    return Output(peer, tuple(comparisons), summary=tuple(summary_line(c) for c in comparisons) + tuple(lines))


def speculation(
    ctx: Context, options: PeerOptions, base: Path, llama_env: dict[str, str] | None = None
) -> dict[str, Any]:
    """Per file: bench/parts/speculative.py's four servers (ours with n-gram drafting and without, llama.cpp's with its
    prompt lookup and without, on the engine's cores), both sides loading the one file; with `speculative_suffix`,
    ours with suffix decoding and llama.cpp's with ngram-mod as well."""
    if options.file:
        files = {USER_FILE: Path(options.file)}
    else:
        wrong = [f for f in options.speculative if FORMATS.get(f, (None,))[0] not in SAME_FILE]
        if wrong:
            same = ", ".join(f for f, (kind, _) in FORMATS.items() if kind in SAME_FILE)
            raise SystemExit(f"--peer-speculative {' '.join(wrong)}: a GGUF file both servers load ({same})")
        generated = gguf_models(base, list(options.speculative), ctx.logdir / "gguf.log")
        files = {fmt: sides(fmt, base, generated).gguf for fmt in options.speculative}
    out = {}
    for fmt, file in files.items():
        servers = "six" if options.speculative_suffix else "four"
        log(f"speculation on {file.name} ({fmt}): {servers} servers, {options.repetitions} repetition(s)")
        # A file that fails (a request refused, a server that would not start) is logged and left out; the rest go on.
        try:
            out[fmt] = speculative.measure(
                file,
                cache_dir(),
                ctx.logdir / f"speculative-{fmt}",
                options.repetitions,
                options.speculative_requests,
                speculative.MAX_TOKENS,
                list(options.speculative_concurrency),
                file,
                options.speculative_suffix,
                llama_env,
            )
        except (RuntimeError, httpx.HTTPError) as exc:
            log(f"speculation on {fmt}: {exc}; left out")
    return out


def speculation_lines(results: dict[str, Any]) -> list[str]:
    """Per file, workload and concurrency: ours drafting against llama.cpp's lookup, and the acceptance."""
    lines = []
    for fmt, r in results.items():
        for key, text in r["estimates"].get(speculative.HEADLINE, {}).items():
            workload = key.split("/")[0]
            lines.append(
                f"speculation {fmt}, {key}, ours drafting / llama.cpp's lookup: {text}; accepted "
                f"{r['acceptance'][workload]:.0%} of drafts"
            )
        for key, text in r["estimates"].get(speculative.SUFFIX_HEADLINE, {}).items():
            workload = key.split("/")[0]
            low, high = r["first_round"][speculative.SUFFIX_HEADLINE][key]
            lines.append(
                f"speculation {fmt}, {key}, suffix decoding / llama.cpp's ngram-mod: {text} (first round "
                f"{low:.2f}-{high:.2f}); accepted {r['acceptance_by_method']['suffix'][workload]:.0%} of drafts"
            )
    return lines


def profiled_workload(w: Workload) -> Workload:
    """The c=1 workload made decode-bound for the profile: the measured one's prefill (128 prompt tokens, a second on
    the 0.5 B model's int4 weights) took more of its samples than its 31 decode steps, and the profile's shares are
    read as shares of a decode step."""
    return replace(w, num_prompts=2, input_len=16, output_len=256)


def _profile_ours(ours: ServerProcess, w: Workload, ctx: Context, tokenizer: str, fmt: str) -> dict[str, Any]:
    """Where our batch-1 decode step goes on this format (py-spy on the engine process): the gap to llama.cpp, named."""
    from bench import profile

    summary = profile.profile_decode(
        profile.compute_process(ours.pid),
        lambda: ctx.load(profiled_workload(w), ours, tokenizer, SERVED),
        ctx.logdir / f"py-spy-peer-{fmt}.folded",
    )
    if summary.get("samples"):
        log(f"peer {fmt}, where our batch-1 decode step goes: {profile.step_line(summary)}")
    return summary


def comparisons(results: dict[str, Any]) -> list[Comparison]:
    """A finished run's peer comparisons, recomputed from its runs (the report and --render)."""
    runs = results.get("peer", {}).get("runs", [])
    out = []
    for fmt in dict.fromkeys(r["comparison"] for r in runs):
        of_fmt = [r for r in runs if r["comparison"] == fmt]
        out += [
            compare(fmt, "ours", "llama.cpp", c, of_fmt, estimates=PEER_ESTIMATES)
            for c in dict.fromkeys(r["concurrency"] for r in of_fmt)
        ]
    return out


def section(results: dict[str, Any], comparisons: list[Comparison], decoded: list[DecodeResult]) -> list[str]:
    p = results["peer"]
    if p.get("skipped"):
        return [f"Peer: skipped ({p['skipped']}).", ""]
    general = results["options"]
    o = general.get("part_options", {}).get("peer") or {  # runs recorded before the part registry
        "input_len": general.get("peer_input_len"),
        "output_len": general.get("peer_output_len"),
    }
    parts = [
        f"Peer: llama.cpp's `llama-server` ({p.get('llama_server', '')}) on the same weights as GGUF, the same "
        "client (vllm.benchmarks.serve, random dataset, ignore_eos, temperature 0, closed loop; both servers "
        f"restarted per repetition), {o.get('input_len')} input / {o.get('output_len')} output tokens, "
        f"{p.get('threads')} compute thread(s) on CPU(s) {p.get('engine_cpus')} for both, llama.cpp's parallel slots = "
        "concurrency; ratios ours/llama.cpp (output tok/s above 1: ours faster; latencies below 1: ours faster). "
        f"{_recounted(p)}" + (f" **{p['repack_off']}.**" if p.get("repack_off") else ""),
        "",
        comparison_table([c for c in comparisons if c.name.startswith("peer")], PEER_COLUMNS, verdicts=False),
        "",
    ]
    kernels = [f"{fmt}: {data['kernel']}" for fmt, data in p.get("formats", {}).items() if data.get("kernel")]
    if kernels:
        parts += [f"Our linear layers ran: {'; '.join(kernels)}.", ""]
    if p.get("tokenization"):
        parts += [f"Tokenization check: {p['tokenization']}", ""]
    for fmt, data in p.get("formats", {}).items():
        if data.get("agreement"):
            parts += [f"Greedy agreement on {Path(data['gguf']).name} ({fmt}): {data['agreement']['line']}.", ""]
    for failed in p.get("failed", []):
        parts += [
            f"Left out: {failed['comparison']} c={failed['concurrency']} repetition {failed['rep'] + 1}: "
            f"{failed['error']}",
            "",
        ]
    if p.get("decode"):
        parts += [
            "Batch-1 decode of both servers against read bandwidth / weight bytes per token (c=1 runs' TPOT p50):",
            "",
            decode_table([DecodeResult(**d) for d in p["decode"]]),
            "",
        ]
    return parts + speculation_table(p.get("speculative") or {}) + profile_lines(p, comparisons)


def speculation_table(results: dict[str, Any]) -> list[str]:
    """Per file, workload and concurrency: each side's drafting against llama.cpp's plain server, and against each
    other; the share of drafted tokens our engine accepted."""
    if not results:
        return []
    first = next(iter(results.values()))
    lines = [
        "Speculative decoding (bench/parts/speculative.py): the service with n-gram drafting (`speculative=ngram`) and "
        "without, llama.cpp's server with its prompt lookup (`--spec-type ngram-simple`) and without, both loading "
        f"the one file; chat requests, temperature 0, {first['max_tokens']} tokens, {first['requests_per_start']} "
        "request rounds per start; completion tok/s ratios with 95% intervals over repetitions.",
        "",
        "| file | text | c | ours drafting / llama.cpp lookup | ours / llama.cpp, neither drafting | drafting / not, "
        "ours | accepted |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for fmt, r in results.items():
        for key in r["interval"].get(speculative.HEADLINE, {}):
            workload, c = key.split("/")
            cells = [_interval_cell(r, name, key) for name in (speculative.HEADLINE, "off/llama.cpp", "ngram/off")]
            lines.append(
                f"| {Path(r['peer_file']).name} ({fmt}) | {workload} | {c.removeprefix('c')} | "
                + " | ".join(cells)
                + f" | {r['acceptance'][workload]:.0%} |"
            )
    return [*lines, "", *suffix_table(results)]


def suffix_table(results: dict[str, Any]) -> list[str]:
    """With --peer-speculative-suffix: suffix decoding against llama.cpp's ngram-mod, over all rounds and over each
    start's first round alone (before either has seen an answer to the same prompt)."""
    measured = {fmt: r for fmt, r in results.items() if speculative.SUFFIX_HEADLINE in r["ratios"]}
    if not measured:
        return []
    lines = [
        "Suffix decoding (`speculative=suffix`) against llama.cpp's `--spec-type ngram-mod`: both draft from earlier "
        "requests as well, so each round after a start's first has seen answers to the same prompts; the first round "
        "alone is its 95% interval over starts.",
        "",
        "| file | text | c | suffix / llama.cpp ngram-mod | first round | suffix / off, ours | accepted |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for fmt, r in measured.items():
        for key in r["ratios"][speculative.SUFFIX_HEADLINE]:
            workload, c = key.split("/")
            low, high = r["first_round"][speculative.SUFFIX_HEADLINE][key]
            cells = [_interval_cell(r, speculative.SUFFIX_HEADLINE, key), f"x{low:.2f}-{high:.2f}"]
            cells.append(_interval_cell(r, "suffix/off", key))
            lines.append(
                f"| {Path(r['peer_file']).name} ({fmt}) | {workload} | {c.removeprefix('c')} | "
                + " | ".join(cells)
                + f" | {r['acceptance_by_method']['suffix'][workload]:.0%} |"
            )
    return [*lines, ""]


def _interval_cell(result: dict[str, Any], name: str, key: str) -> str:
    samples = result["ratios"].get(name, {}).get(key)
    if not samples:
        return ""
    e = estimate(name, "ratio", samples)
    return f"x{e.value:.2f}" + (f" [{e.low:.2f}, {e.high:.2f}]" if e.low is not None and e.high is not None else "")


def profile_lines(peer: dict[str, Any], comparisons: list[Comparison]) -> list[str]:
    """Per profiled format, where our batch-1 decode step goes, in ms of our c=1 TPOT p50 where it was measured."""
    parts = []
    for fmt, data in peer.get("formats", {}).items():
        prof = data.get("profile") or {}
        ours = next((c for c in comparisons if c.name == f"peer-{fmt}" and c.concurrency == 1), None)
        if prof.get("samples"):
            tpot = ours.candidate_metrics["tpot_p50_ms"] if ours else None
            parts += [
                f"Where our batch-1 decode step goes on {fmt} (py-spy --native on the engine process, one extra run, "
                f"{prof['samples']} samples; ms at the c=1 TPOT p50): {step_line(prof, tpot)}.",
                "",
            ]
    return parts


def _recounted(peer: dict[str, Any]) -> str:
    """How many runs' output-token counts came from the server's own counter instead of the client's."""
    runs = [r for r in peer.get("runs", []) if r["client"].get("output_tokens_counted_by_server") is not None]
    fixed = [
        r
        for r in runs
        if r["client"]["output_tokens_counted_by_client"] != r["client"]["output_tokens_counted_by_server"]
    ]
    if not fixed:
        return ""
    return (
        f"In {len(fixed)} of {len(runs)} llama.cpp runs vLLM's client counted fewer output tokens than llama-server "
        "generated (it skips the usage llama-server sends next to the last chunk's text and re-tokenizes the text); "
        "those runs' output tok/s and TPOT use llama-server's own count (its /metrics), which equalled what was asked."
    )
