"""Which speed decisions the calibration times on this machine, and what its timings decide. Pure: the questions
come from the backend registry and the model's facts, the verdicts from recorded timings (service/startup/calibration_run.py
takes them on the engine's CPUs; tests feed recorded ones).

A question is one decision the policy would otherwise take from the build machines' table, with its candidates as
the settings they stand for (what a user would set to get each). A candidate runs what the policy plans for those
settings, so the calibration times exactly what the engine would run. The table's choice stays the default: a
candidate replaces it only when it is faster at batch-1 decode by a margin whose 95% interval over the paired
rounds excludes 1, and only when it ran and matched the reference matmul.
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from service.facts.quantization import QuantFacts
from service.kernels.registry import INT4_WEIGHT_ONLY

Mode = Literal["off", "auto", "force"]
PREFILL_M = 128  # the prefill-sized batch of rows each candidate is also timed at (decode is M=1)
CONFIDENCE = 0.95
# Two-sided 95% Student t quantiles by degrees of freedom (rounds - 1); 1.96 beyond.
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}


@dataclass(frozen=True)
class Candidate:
    name: str  # what the report calls it: "vllm", "vllm-w4a8", "auto-round", "bfloat16", "float32"
    settings: Mapping[str, Any]  # the settings it stands for
    kernel: str = ""  # the policy's kernel key(s) it runs (quant.linear_kernel), filled from the plan
    env: Mapping[str, str] = field(default_factory=dict)  # what the kernel reads (VLLM_CPU_INT4_W4A8, ...)
    # The environment its process starts with, where it is not the engine's: another backend's platform, preloads
    # and OpenMP runtime, which a process takes at its start (timed in a process of its own).
    process_env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Question:
    decision: str  # "int4_kernel" | "w8a8_kernel" | "dtype" | "zentorch_weight_prepack" | "backend"
    default: str  # the candidate the table picks
    candidates: tuple[Candidate, ...]
    shapes: tuple[tuple[int, int], ...]  # (K, N) of the model's linear layers, each once
    weights: Literal["int4", "int8", "dense"]
    layout: Literal["compressed-tensors", "gptq", "awq"] = "compressed-tensors"
    group_size: int | None = None  # int4: None per output channel
    symmetric: bool = True
    act_dtype: str = "bfloat16"  # int4: the activations' dtype (the engine dtype)
    # The least decode lead (the interval's lower end) that replaces the table's choice: above 1 where the timed
    # layers are only part of what the choice changes (a backend also brings its attention, runtime and platform).
    min_gain: float = 1.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Timing:
    """One candidate's seconds per pass over every shape, per round (decode: M=1; prefill: M=PREFILL_M), or why it
    was excluded (it crashed, or its output missed the reference)."""

    candidate: str
    decode_s: tuple[float, ...] = ()
    prefill_s: tuple[float, ...] = ()
    error: str | None = None
    max_rel_err: float | None = None  # against the reference matmul on the same inputs


@dataclass(frozen=True)
class Verdict:
    decision: str
    chosen: str  # the winning candidate's name
    settings: Mapping[str, Any]  # what it stands for (empty: the table's choice stands)
    reason: str
    timings: tuple[Timing, ...]


def int4_question(
    quant: QuantFacts | None, dtype: str, candidates: tuple[Candidate, ...], default: str
) -> Question | None:
    """The int4 kernel (and its activation type) of an int4 weight-only checkpoint, when it has several candidates."""
    if quant is None or quant.key not in INT4_WEIGHT_ONLY or len(candidates) < 2:
        return None
    if quant.method == "awq" and quant.weight_symmetric:
        return None  # vLLM's AWQ path hands its kernels zero points always; a zero_point=false file is not timed
    if default not in {c.name for c in candidates}:
        return None
    shapes = tuple(dict.fromkeys((s.in_features, s.out_features) for s in quant.linear_shapes))
    if not shapes:
        return None
    layout: Literal["compressed-tensors", "gptq", "awq"] = (
        quant.method if quant.method in ("gptq", "awq") else "compressed-tensors"  # type: ignore[assignment]
    )
    return Question(
        "int4_kernel", default, candidates, shapes, "int4", layout, quant.group_size, quant.weight_symmetric, dtype
    )


def w8a8_question(
    quant: QuantFacts | None, dtype: str, candidates: tuple[Candidate, ...], default: str
) -> Question | None:
    """The W8A8 kernel (per-channel int8 weights, dynamic per-token activations) where several can run it."""
    if quant is None or quant.key != "w8a8" or len(candidates) < 2 or default not in {c.name for c in candidates}:
        return None
    shapes = tuple(dict.fromkeys((s.in_features, s.out_features) for s in quant.linear_shapes))
    if not shapes:
        return None
    return Question("w8a8_kernel", default, candidates, shapes, "int8", act_dtype=dtype)


def dense_question(
    decision: str, default: str, candidates: tuple[Candidate, ...], shapes: tuple[tuple[int, int], ...], dtype: str
) -> Question:
    """A decision about the unquantized linear layers, timed through vLLM's own CPU GEMM dispatch."""
    return Question(decision, default, candidates, shapes, "dense", act_dtype=dtype)


BACKEND_MIN_GAIN = 1.10  # the linear layers are most of a step's time on CPU, not all of it


def backend_question(
    default: str, candidates: tuple[Candidate, ...], shapes: tuple[tuple[int, int], ...], dtype: str
) -> Question:
    """The backend's own kernels or vLLM's generic ones for the unquantized linear layers: a switch of platform,
    preloads and attention too, so it must win by BACKEND_MIN_GAIN."""
    return Question("backend", default, candidates, shapes, "dense", act_dtype=dtype, min_gain=BACKEND_MIN_GAIN)


def dtype_question(shapes: tuple[tuple[int, int], ...], default: str, env: Mapping[str, Mapping[str, str]]) -> Question:
    """bf16 against fp32 on a CPU without native bf16, each with what its engine's linear layers would run (`env`
    per dtype: the service's bf16 kernel where the dense-kernel policy plans it for that dtype)."""
    candidates = tuple(Candidate(d, {"dtype": d}, d, env.get(d, {})) for d in ("bfloat16", "float32"))
    return dense_question("dtype", default, candidates, shapes, default)


def cache_key(machine: Mapping[str, Any], questions: tuple[Question, ...]) -> str:
    """What a stored calibration is valid for: the CPU (model, ISA flags; not the microcode), the allowed CPUs and
    quota, the software versions (in `machine`), and each question (shapes, candidates, what they run)."""
    text = json.dumps({"machine": machine, "questions": [q.as_dict() for q in questions]}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _ratio_interval(slow: tuple[float, ...], fast: tuple[float, ...]) -> tuple[float, float, float]:
    """slow/fast over paired rounds: geometric mean and its 95% t interval."""
    logs = [math.log(s / f) for s, f in zip(slow, fast, strict=False)]
    mean = statistics.fmean(logs)
    if len(logs) < 2:
        return math.exp(mean), 0.0, math.inf
    half = T95.get(len(logs) - 1, 1.96) * statistics.stdev(logs) / math.sqrt(len(logs))
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


def describe(t: Timing) -> str:
    if t.error:
        return f"{t.candidate}: excluded ({t.error})"
    return (
        f"{t.candidate}: decode {statistics.median(t.decode_s) * 1e3:.2f} ms, "
        f"prefill {statistics.median(t.prefill_s) * 1e3:.1f} ms per pass"
    )


def decide(question: Question, timings: tuple[Timing, ...]) -> Verdict:
    """The fastest candidate at batch-1 decode when its margin over the table's choice is resolved; else the table's."""
    by_name = {c.name: c for c in question.candidates}
    ran = [t for t in timings if t.error is None and t.decode_s and t.candidate in by_name]
    numbers = "; ".join(describe(t) for t in timings)
    keep = Verdict(question.decision, question.default, {}, "", timings)
    if not ran:
        return _with(keep, f"no candidate ran ({numbers}): the table's {question.default} stands")
    fastest = min(ran, key=lambda t: statistics.median(t.decode_s))
    default = next((t for t in ran if t.candidate == question.default), None)
    if default is None:
        reason = f"the table's {question.default} did not run here; {fastest.candidate} is the fastest that did"
        return Verdict(
            question.decision, fastest.candidate, by_name[fastest.candidate].settings, f"{reason} ({numbers})", timings
        )
    if fastest is default:
        others = [t for t in ran if t is not default]
        if not others:
            return _with(keep, f"the table's {question.default} is the only candidate that ran ({numbers})")
        runner_up = min(others, key=lambda t: statistics.median(t.decode_s))
        lead = _margin(runner_up, default)
        return _with(
            keep,
            f"the table's {question.default} measured fastest here, ahead of {runner_up.candidate} by {lead} ({numbers})",
        )
    ratio, low, high = _ratio_interval(default.decode_s, fastest.decode_s)
    margin = _margin(default, fastest)
    if low <= 1:
        return _with(
            keep,
            f"{fastest.candidate} against the table's {question.default}: {margin} does not resolve the margin, so the table's stands ({numbers})",
        )
    if low <= question.min_gain:
        return _with(
            keep,
            f"{fastest.candidate} against the table's {question.default}: {margin} is not surely above the "
            f"x{question.min_gain:.2f} this decision must win by, so the table's stands ({numbers})",
        )
    reason = f"{fastest.candidate} is faster than the table's {question.default} here: {margin} ({numbers})"
    return Verdict(question.decision, fastest.candidate, by_name[fastest.candidate].settings, reason, timings)


def _margin(slow: Timing, fast: Timing) -> str:
    ratio, low, high = _ratio_interval(slow.decode_s, fast.decode_s)
    return f"decode x{ratio:.2f} [{low:.2f}, {high:.2f}] ({CONFIDENCE:.0%} interval, {len(fast.decode_s)} rounds)"


def _with(verdict: Verdict, reason: str) -> Verdict:
    return Verdict(verdict.decision, verdict.chosen, verdict.settings, reason, verdict.timings)
