"""Which quantized linear kernel is fastest on this machine, and is it right? One vLLM engine per candidate.

For each format (bf16 reference, W8A8 dynamic, W8A8 static, W4A16 group 128) of the ~0.5 B random Llama
(harness/models.py, quantized by harness/quantized_models.py) and each kernel the machine can be steered to
(VLLM_CPU_INT4_W4A8=0/1, ZentorchInt8ScaledMMLinearKernel on/off on Zen, the service's auto-round-lib int4 kernel
via SERVICE_INT4_KERNEL; for bf16, the backend's lowering and zentorch's prepack on Zen: the calibration's
questions), run vLLM's offline `LLM` in a fresh process (enforce_eager, batch 1) with the environment
the service's policy sets for that candidate, and measure:
- decode tok/s at batch 1: (N tokens - 1 token) / (time(N) - time(1)) for one short prompt, greedy, ignore_eos;
- prefill tok/s: prompt tokens / time of a 1-token generation of a long prompt (prefix caching off);
- quality: greedy decode scored in transformers (harness/quant_quality.py) against the bf16 source (what the
  format loses, kernel included) and against the exact dequantization of the clean checkpoint (an ideal kernel): the
  second is the kernel check (its mean |dlogprob| within the scheme's threshold), since a random-weight model's
  near-flat logits let rounding alone move top-1 (the bench model's W4A16 copy scores top-1 0.18 against bf16 even
  with an ideal kernel, and a correct W8A8 kernel's activation quantization 0.78 against its exact dequantization);
each over `--reps` repetitions (median, min-max). The kernel each candidate ran is the one the service policy
predicts for the live backend with that candidate's knobs, confirmed against the engine's log markers.

    .venv/bin/python bench/parts/quant_kernels.py [--formats bf16,fp32,w8a8,w8a8-static,w4a16] [--reps 3] [--corrupt]

Writes .cache/bench/quant_kernels.json and prints a table; `python -m bench` (`make bench`) runs the same measurement
into its results directory and its table.md. CPU time matters here: run on an idle machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bench.context import Context
    from bench.output import Output
    from bench.stats import Comparison, DecodeResult

REPO = Path(__file__).resolve().parents[2]
# Run as a script, Python puts its own folder first on sys.path, where a module could shadow the stdlib's.
sys.path[:] = [str(REPO)] + [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

DECODE_PROMPT = "hello world, the server thread answers"
DECODE_TOKENS = 64
PREFILL_TOKENS = 512
RESULT = "quant_kernels result: "


@dataclass(frozen=True)
class Candidate:
    format: str  # a scheme of harness/quantized_models.SCHEMES, "bf16", "fp32" (an fp32 engine), or "<scheme>-corrupt"
    env: dict[str, str]

    @property
    def label(self) -> str:
        knobs = ",".join(f"{k}={v}" for k, v in sorted(self.env.items()))
        return f"{self.format}" + (f" [{knobs}]" if knobs else "")


def candidates(backend: str, formats: list[str], corrupt: bool, native_bf16: bool) -> list[Candidate]:
    """The knobs that change the kernel on this backend (service/policy/linear/quant.py RULES) and CPU (`native_bf16`: it
    computes bf16, AVX-512 BF16 or AMX)."""
    from service.policy.machine.backends import BACKENDS

    out = []
    for fmt in formats:
        if fmt == "w4a16":  # vLLM's int4 kernels (where the backend has them) and the service's
            ours = [Candidate(fmt, {"SERVICE_INT4_KERNEL": k}) for k in ("auto-round", "ggml")]
            if not isinstance(BACKENDS[backend].quant["w4a16"], str):
                knob = [{"VLLM_CPU_INT4_W4A8": v} for v in ("0", "1")] if backend in ("zen", "amx") else [{}]
                ours = [Candidate(fmt, {"SERVICE_INT4_KERNEL": "vllm", **k}) for k in knob] + ours
            out += ours
        elif fmt == "bf16":  # the calibration's backend and prepack questions, where the backend has them
            entry = BACKENDS[backend]
            out.append(Candidate(fmt, {}))
            if not native_bf16:  # vLLM's bf16 GEMM (converted in software) or the service's kernel
                out[-1:] = [Candidate(fmt, {"SERVICE_BF16_WEIGHTS": v}) for v in ("off", "on")]
            out += [Candidate(fmt, {"SERVICE_BACKEND": low}) for low in entry.lowers_to]
            if entry.decide is not None:
                out.append(Candidate(fmt, {"SERVICE_ZENTORCH_WEIGHT_PREPACK": "false"}))
        elif fmt == "fp32":  # an fp32 engine: vLLM's fp32 GEMM, or the bf16 weights of the service's kernel
            out += [Candidate(fmt, {"SERVICE_BF16_WEIGHTS": v}) for v in ("off", "on")]
        elif fmt == "w8a8":  # vLLM's int8 kernels (zentorch's and oneDNN's on Zen) and the service's
            vllm = {"SERVICE_INT8_KERNEL": "vllm"}
            out.append(Candidate(fmt, vllm))
            if backend == "zen":
                out.append(Candidate(fmt, {**vllm, "VLLM_DISABLED_KERNELS": "ZentorchInt8ScaledMMLinearKernel"}))
            out.append(Candidate(fmt, {"SERVICE_INT8_KERNEL": "ggml"}))
        else:
            out.append(Candidate(fmt, {}))
    if corrupt:
        out += [Candidate(f"{fmt}-corrupt", {}) for fmt in formats if fmt == "w8a8"]
    return out


def model_dir(cache: Path, fmt: str) -> Path:
    from harness.models import ensure_bench_model
    from harness.quantized_models import quantized_bench

    if fmt in ("bf16", "fp32"):
        return ensure_bench_model(cache)
    scheme, _, corrupt = fmt.partition("-corrupt")
    return quantized_bench(cache, scheme, 4.0 if fmt.endswith("-corrupt") else None)


def predicted_kernel(
    backend_name: str, directory: Path, env: dict[str, str], dtype: str = "bfloat16"
) -> tuple[str, dict[str, str]]:
    """What the service policy says this candidate runs (the live machine, this candidate's environment, its
    SERVICE_* variables as the user's settings), and the environment the policy sets for it."""
    from service.facts.cpu import read_cpuinfo
    from service.facts.model import inspect_model
    from service.facts.software import read_software
    from service.policy.linear.quant import plan_quant
    from service.policy.machine.backends import BACKENDS
    from service.settings import Settings

    facts = inspect_model(str(directory)).quant
    settings = Settings(**{k.removeprefix("SERVICE_").lower(): v for k, v in env.items() if k.startswith("SERVICE_")})
    if facts is None:
        return _dense_plan(settings, dtype)
    plan = plan_quant(
        facts,
        BACKENDS[backend_name],
        "bfloat16",
        settings,
        env,
        auto_round_lib=read_software().auto_round_lib,
        ggml_kernel=read_software().ggml_kernel,
        vnni=read_cpuinfo().isa.vnni,
    )
    decided = plan.find("quant.linear_kernel")
    return (decided.value if decided else "refused: " + "; ".join(plan.errors)), plan.env


def _dense_plan(settings: Any, dtype: str) -> tuple[str, dict[str, str]]:
    """An unquantized model's "kernel": the backend's GEMM dispatch (its vLLM platform, which the service's platform
    plugin enforces from the environment) and the backend's own knobs (zentorch's prepack), or for an fp32 engine
    with bf16 weights the service's kernel."""
    from service.facts.hardware import read_hardware
    from service.facts.software import read_software
    from service.in_vllm.contract import PLATFORM_ENV
    from service.policy.linear.dense_kernel import OURS_BF16, plan_dense_kernel
    from service.policy.machine.backend import choose_backend

    cpu = read_hardware().cpu
    choice = choose_backend(cpu, read_software(), settings.backend)
    if choice.entry is None:
        return f"refused: {choice.reason}", {}
    own = choice.entry.decide(settings, frozenset()).env if choice.entry.decide else {}
    user = settings.explicitly_set()
    # the bench model is stored in bf16
    dense = plan_dense_kernel(
        None, "bfloat16", choice.entry, dtype, cpu.isa.native_bf16, settings, user, read_software().ggml_kernel
    )
    weights = dense.find("engine.linear_weights")
    kernel = "bf16-weights" if weights and weights.value in ("bf16", OURS_BF16) else f"{choice.name} GEMM"
    # VLLM_TARGET_DEVICE emptied as the policy does: vLLM takes "cpu" as its platform and never asks the plugin.
    return kernel, {PLATFORM_ENV: choice.entry.platform, "VLLM_TARGET_DEVICE": "", **own, **dense.env}


def bytes_per_token(directory: Path) -> int:
    """Bytes one decode step reads in the rows' bf16 (the service's model fact, service/facts/model.py)."""
    from service.facts.model import inspect_model

    reads = inspect_model(str(directory)).decode_reads
    assert reads is not None, f"{directory} has no safetensors headers"
    return reads.bytes_in(2)


def compute_cpus() -> list[int]:
    """The CPUs vLLM's engine computes on here (the service's thread plan: allowed cores minus the reserved)."""
    from service.facts.hardware import read_hardware
    from service.policy.machine.threads import plan_threads

    hw = read_hardware()
    return list(plan_threads(hw.topology, hw.limits, None, 1).ranks[0])


# ---------------------------------------------------------------------------------------------------------
# Worker: one engine, one candidate (a fresh process, so each candidate's environment reaches vLLM)
# ---------------------------------------------------------------------------------------------------------


def _worker(spec: dict[str, Any]) -> dict[str, Any]:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from harness.quant_quality import QUALITY_TOKENS

    llm = LLM(
        model=spec["model"],
        dtype=spec["dtype"],
        enforce_eager=True,
        max_model_len=PREFILL_TOKENS + 64,
        max_num_seqs=1,
        enable_prefix_caching=False,
        kv_cache_memory_bytes=512 * 2**20,
        seed=0,
    )
    tok = llm.get_tokenizer()
    short = TokensPrompt(prompt_token_ids=tok(DECODE_PROMPT)["input_ids"])
    long_ids = (tok(DECODE_PROMPT * 200)["input_ids"])[:PREFILL_TOKENS]
    greedy: dict[str, Any] = dict(temperature=0.0, ignore_eos=True)

    def timed(prompt: TokensPrompt, n: int) -> float:
        t = time.perf_counter()
        llm.generate([prompt], SamplingParams(max_tokens=n, **greedy), use_tqdm=False)
        return time.perf_counter() - t

    timed(short, 8)  # warm-up: first-call allocations and repacks
    decode, prefill = [], []
    for _ in range(spec["reps"]):
        one, many = timed(short, 1), timed(short, DECODE_TOKENS)
        decode.append((DECODE_TOKENS - 1) / (many - one))
        prefill.append(PREFILL_TOKENS / timed(TokensPrompt(prompt_token_ids=long_ids), 1))

    outs = llm.generate(
        [TokensPrompt(prompt_token_ids=p) for p in spec["prompts"]],
        SamplingParams(max_tokens=QUALITY_TOKENS, logprobs=0, **greedy),
        use_tqdm=False,
    )
    gens, lps = [], []
    for o in outs:
        out = o.outputs[0]
        assert out.logprobs is not None  # asked for (logprobs=0): one entry per generated token
        gens.append(list(out.token_ids))
        lps.append([out.logprobs[i][t].logprob for i, t in enumerate(out.token_ids)])
    return {"decode": decode, "prefill": prefill, "generated": gens, "logprobs": lps}


def run_candidate(
    cand: Candidate, policy_env: dict[str, str], directory: Path, prompts: list[list[int]], reps: int, log: Path
) -> dict[str, Any]:
    dtype = "float32" if cand.format == "fp32" else "bfloat16"
    spec = {"model": str(directory), "reps": reps, "prompts": prompts, "dtype": dtype}
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1", **cand.env, **policy_env}
    # stdout and stderr both into the log: vLLM logs its kernel choice (the markers read back) to stdout.
    with open(log, "w") as f:
        proc = subprocess.run(
            [sys.executable, __file__, "--worker", json.dumps(spec)],
            env=env,
            stdout=f,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=1800,
        )
    if proc.returncode != 0:
        return {"error": f"exit {proc.returncode}, log {log}"}
    line = next(line for line in log.read_text(errors="replace").splitlines() if line.startswith(RESULT))
    result: dict[str, Any] = json.loads(line[len(RESULT) :])
    return result


def _summary(values: list[float]) -> dict[str, Any]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "runs": values}


def measure(
    formats: list[str], reps: int, corrupt: bool, cache: Path, out: Path, progress: Callable[[str], None] = print
) -> dict[str, Any]:
    """Every candidate of `formats` on the live backend, one engine each; the report (also written to `out`, after
    each candidate) with the bandwidth ceiling of each row."""
    from harness.quant_quality import prompt_ids, score
    from harness.quantized_models import dequantized_state
    from service.facts.hardware import read_hardware
    from service.facts.software import read_software
    from service.in_vllm.contract import PLATFORM_ENV
    from service.kernels.registry import KERNELS
    from service.policy.machine.backend import choose_backend

    hardware = read_hardware()
    backend = choose_backend(hardware.cpu, read_software()).name or "none"
    report: dict[str, Any] = {
        "machine": f"{hardware.cpu.vendor} {hardware.cpu.model_name} ({hardware.cpu.microarchitecture}), "
        f"backend {backend}",
        "backend": backend,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "reps": reps,
        "rows": [],
    }
    source = model_dir(cache, "bf16")
    prompts = prompt_ids(source)
    exact: dict[str, dict[str, Any]] = {}  # per scheme: the clean checkpoint's dequantized weights (the ideal kernel)
    out.parent.mkdir(parents=True, exist_ok=True)
    for cand in candidates(backend, formats, corrupt, hardware.cpu.isa.native_bf16):
        directory = model_dir(cache, cand.format)
        kernel, policy_env = predicted_kernel(
            backend, directory, cand.env, "float32" if cand.format == "fp32" else "bfloat16"
        )
        log = out.parent / f"quant_kernels-{cand.label.replace(' ', '_').replace('/', '_')}.log"
        progress(f"quantized kernels: {cand.label} (policy: {kernel}) ...")
        row: dict[str, Any] = {"format": cand.format, "env": cand.env, "kernel": kernel, "log": str(log)}
        if kernel.startswith("refused: "):  # the service would not start it; the engine would die on it
            report["rows"].append({**row, "error": kernel})
            continue
        result = run_candidate(cand, policy_env, directory, prompts, reps, log)
        if "error" in result:
            report["rows"].append({**row, **result})
            progress(f"  failed: {result['error']}")
            continue
        logged = log.read_text(errors="replace")
        markers = [m for k in kernel.split("+") if k in KERNELS for m in KERNELS[k].log_markers]
        if PLATFORM_ENV in policy_env:  # a dense row: every vLLM process ran the backend's platform
            markers.append(f'"platform": "{policy_env[PLATFORM_ENV]}"')
        scheme = cand.format.removesuffix("-corrupt")
        quality = score(source, prompts, result["generated"], result["logprobs"])
        kernel_check = quality
        if scheme not in ("bf16", "fp32"):
            if scheme not in exact:
                exact[scheme] = dequantized_state(model_dir(cache, scheme))
            kernel_check = score(source, prompts, result["generated"], result["logprobs"], exact[scheme])
        row.update(
            decode=_summary(result["decode"]),
            prefill=_summary(result["prefill"]),
            kernel_confirmed=all(m in logged for m in markers),
            quality=quality.as_dict(),
            kernel_quality=kernel_check.as_dict(),
            quality_passes=kernel_check.logprob_passes(scheme),
        )
        report["rows"].append(row)
        out.write_text(json.dumps(report, indent=2))  # partial: a later candidate may not finish
        progress(f"  {row_line(row)}")
    report["load_average"] = os.getloadavg()
    complete(report, cache)
    out.write_text(json.dumps(report, indent=2))
    return report


def row_line(row: dict[str, Any]) -> str:
    d, p, q, k = row["decode"], row["prefill"], row["quality"], row["kernel_quality"]
    return (
        f"decode {d['median']:.1f} tok/s [{d['min']:.1f}-{d['max']:.1f}], prefill {p['median']:.0f} tok/s "
        f"[{p['min']:.0f}-{p['max']:.0f}]; vs bf16 top1 {q['top1']:.2f} |dlogprob| {q['mean_abs_dlogprob']:.3f}; "
        f"vs the exact dequantization top1 {k['top1']:.2f} |dlogprob| {k['mean_abs_dlogprob']:.3f} "
        f"({'pass' if row['quality_passes'] else 'FAIL'}); kernel in the engine log: {row['kernel_confirmed']}"
    )


@dataclass(frozen=True)
class QuantOptions:
    format: tuple[str, ...] = ("bf16", "fp32", "w8a8", "w8a8-static", "w4a16")
    repetitions: int = 3


def run(ctx: Context, options: QuantOptions) -> Output:
    """Each quantized format's linear kernel on the live backend, every candidate the policy can steer to, with
    decode, prefill, bandwidth ceiling, and quality against the bf16 source and against the checkpoint's exact
    dequantization (the kernel check, which a corrupted copy must fail)."""
    from bench.context import cache_dir
    from bench.output import Output, log

    report = measure(
        list(options.format), options.repetitions, True, cache_dir(), ctx.logdir / "quant_kernels.json", log
    )
    return Output(report, summary=tuple(quant_lines(report)))


def quant_lines(report: dict[str, Any]) -> list[str]:
    return [
        f"quantized {Candidate(r['format'], r['env']).label} ({r['kernel']}): "
        + (
            r["error"]
            if "error" in r
            else f"{r['decode']['median']:.1f} tok/s decode, {r['ceiling_fraction']:.0%} "
            f"of the ceiling, {r['prefill']['median']:.0f} tok/s prefill, kernel check "
            f"{'pass' if r['quality_passes'] else 'fail'}"
        )
        for r in report["rows"]
    ]


def section(results: dict[str, Any], comparisons: list[Comparison], decoded: list[DecodeResult]) -> list[str]:
    return [heading(results["quant_kernels"]), "", markdown_table(results["quant_kernels"]), ""]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--formats", default="bf16,fp32,w8a8,w8a8-static,w4a16")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--corrupt", action="store_true", help="also run the W8A8 copy with a corrupted o_proj scale (x4)")
    ap.add_argument("--cache", type=Path, default=REPO / ".cache")
    ap.add_argument("--out", type=Path, default=REPO / ".cache" / "bench" / "quant_kernels.json")
    ap.add_argument("--render", type=Path, help="re-print (and complete) a saved result file instead of measuring")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(RESULT + json.dumps(_worker(json.loads(args.worker))), flush=True)
        return
    if args.render:
        report = json.loads(args.render.read_text())
        complete(report, args.cache)
        args.render.write_text(json.dumps(report, indent=2))
    else:
        report = measure(args.formats.split(","), args.reps, args.corrupt, args.cache, args.out)
        report["command"] = " ".join(sys.argv)
        args.out.write_text(json.dumps(report, indent=2))
    print("\n" + heading(report) + "\n\n" + markdown_table(report))
    print(f"\nwritten to {args.render or args.out}")


def complete(report: dict[str, Any], cache: Path) -> None:
    """Add the read bandwidth (bench/bandwidth.py on the engine's CPUs), each row's bytes/token and its ceiling."""
    from bench.bandwidth import read_bandwidth

    if "bandwidth" not in report:
        report["bandwidth"] = read_bandwidth(compute_cpus(), size_bytes=1 << 30, repeats=5)
    gbs = report["bandwidth"]["gbs"]
    for r in report["rows"]:
        if "decode" in r:
            # fp32 weights read twice the bench model's bf16 bytes (the embeddings' share aside)
            wide = r["format"] == "fp32" and r["kernel"] != "bf16-weights"
            r["bytes_per_token"] = bytes_per_token(model_dir(cache, r["format"])) * (2 if wide else 1)
            r["ceiling_tok_s"] = gbs * 1e9 / r["bytes_per_token"]
            r["ceiling_fraction"] = r["decode"]["median"] / r["ceiling_tok_s"]


def heading(report: dict[str, Any]) -> str:
    load = report.get("load_average")
    return (
        f"Quantized linear kernels on {report['machine']} ({report['date']}): vLLM's offline engine per candidate, "
        f"batch 1, median [min-max] of {report.get('reps', '?')} repetitions; read bandwidth "
        f"{report['bandwidth']['gbs']:.1f} GB/s on CPU(s) {report['bandwidth']['cpus']}"
        + (f"; load average {load[0]:.1f} at the end" if load else "")
        + ". Quality (harness/quant_quality.py): greedy tokens scored in transformers against the bf16 source "
        "(what the format loses) and against the clean checkpoint's exact dequantization (the kernel check: mean abs "
        "dlogprob within the scheme's threshold; the corrupted copy must fail it)."
    )


def markdown_table(report: dict[str, Any]) -> str:
    head = (
        "| candidate | kernel (policy) | in engine log | decode tok/s | prefill tok/s | MB/token | of ceiling "
        "| vs bf16: top-1, mean abs dlogprob | vs exact dequantization: top-1, mean abs dlogprob | kernel check |"
    )
    lines = [head, "| " + " | ".join(["---"] * 10) + " |"]
    for r in report["rows"]:
        label = Candidate(r["format"], r["env"]).label
        if "error" in r:
            lines.append(f"| {label} | {r['kernel']} | {r['error']} |" + " |" * 7)
            continue
        d, p, q = r["decode"], r["prefill"], r["quality"]
        k = r.get("kernel_quality", q)
        expected = "pass" if not r["format"].endswith("-corrupt") else "fail"
        verdict = "pass" if r["quality_passes"] else "fail"
        lines.append(
            f"| {label} | `{r['kernel']}` | {'yes' if r['kernel_confirmed'] else 'NO'} "
            f"| {d['median']:.1f} [{d['min']:.1f}-{d['max']:.1f}] | {p['median']:.0f} [{p['min']:.0f}-{p['max']:.0f}] "
            f"| {r['bytes_per_token'] / 1e6:.0f} | {r['ceiling_fraction']:.0%} "
            f"| {q['top1']:.2f}, {q['mean_abs_dlogprob']:.3f} | {k['top1']:.2f}, {k['mean_abs_dlogprob']:.3f} "
            f"| {verdict}" + ("" if verdict == expected else f" (expected {expected})") + " |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
