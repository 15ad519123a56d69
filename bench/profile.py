"""py-spy while the load runs: on the front end (the API server process), what Python dominates; on the engine's
compute process during batch-1 decode (with native frames), where a decode step's time goes."""

from __future__ import annotations

import bisect
import collections
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def py_spy() -> str | None:
    here = Path(sys.executable).parent / "py-spy"
    return str(here) if here.exists() else shutil.which("py-spy")


def start_record(pid: int, out: Path, rate: int = 200, native: bool = False) -> subprocess.Popen[bytes] | None:
    """Collapsed stacks (one 'frame;frame;... count' line per stack) of `pid` only, GIL idle excluded. Native frames
    need the process paused per sample (py-spy refuses --native with --nonblocking): a profiled run is uncounted."""
    exe = py_spy()
    if exe is None:
        return None
    mode = ["--native", "--threads"] if native else ["--nonblocking"]
    return subprocess.Popen(
        [exe, "record", "--pid", str(pid), "--rate", str(rate), "--format", "raw", "--output", str(out), *mode],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )


def compute_process(server_pid: int) -> int | None:
    """The process that runs the model's forward pass: vLLM's worker (VLLM::Worker...) where there is one, else the
    engine core (one rank on CPU runs the model in the engine-core process)."""
    import psutil

    try:
        children = psutil.Process(server_pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return None
    for marker in ("Worker", "EngineCore"):
        for child in children:
            try:
                if marker in child.name() or marker in " ".join(child.cmdline()):
                    return int(child.pid)
            except psutil.NoSuchProcess:
                continue
    return None


def stop_record(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is None:
        return
    proc.send_signal(2)  # SIGINT: py-spy writes what it has and exits
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


_REPO = f"{Path(__file__).resolve().parents[1]}/"


def _frame_name(frame: str) -> str:
    # py-spy raw frames look like "function (path/to/file.py:123)"
    name, _, where = frame.partition(" (")
    where = where.rstrip(")")
    path = where.rsplit(":", 1)[0]
    for marker in ("site-packages/", "lib/python3.11/", _REPO):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    return f"{name} ({path})"


def summarize(
    folded: str,
    top: int = 15,
    areas: Areas | None = None,
    threads_with: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Self time per function, and samples by area (innermost frame with a known area), as fractions. With
    `threads_with` (a recording made with --threads), only the threads that ever showed one of those frames count:
    in native mode py-spy samples threads blocked in the C library as well, which are not where the work is."""
    stacks: list[tuple[str, list[str], int]] = []
    for line in folded.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = [f for f in stack.split(";") if f]
        thread = frames.pop(0) if frames and frames[0].startswith("thread (") else ""
        stacks.append((thread, frames, int(count)))
    kept = {t for t, frames, _ in stacks if any(m in f for f in frames for m in threads_with)}
    # Where the run computes on ggml (its frames are named elsewhere in the profile), code py-spy cannot name right
    # under a torch op call is ggml's: the unwinder loses ggml's frames in some samples (it is not JIT code).
    ggml_run = any(GGML in f for _, frames, _ in stacks for f in frames)
    self_count: collections.Counter[str] = collections.Counter()
    area_count: collections.Counter[str] = collections.Counter()
    total = left_out = 0
    for thread, frames, n in stacks:
        if threads_with and thread not in kept:
            left_out += n
            continue
        total += n
        if frames:
            self_count[_frame_name(frames[-1])] += n
        # Each sample goes to the area of its innermost frame that has one: a partition that sums to 100%.
        area = _stack_area(frames, areas or FRONT_END, ggml_run)
        area_count[area] += n
    out: dict[str, Any] = {"samples": total, "self": [], "by_area": []}
    if threads_with:
        out |= {"threads": sorted(t.split(": ", 1)[-1] for t in kept), "samples_of_other_threads": left_out}
    if total:
        out["self"] = [(name, n / total) for name, n in self_count.most_common(top)]
        out["by_area"] = [(name, n / total) for name, n in area_count.most_common()]
    return out


AREAS = (
    ("selector_events.py", "event-loop socket I/O (stdlib asyncio selector loop)"),
    ("selectors.py", "event-loop socket I/O (stdlib asyncio selector loop)"),
    ("uvloop", "event loop (uvloop)"),
    ("concurrent/futures", "thread pool hand-offs"),
    ("service/server/run.py", None),
    ("service/__main__.py", None),
    ("service/server/", "service front end (our middleware, metrics, app)"),
    ("vllm/entrypoints/", "vLLM OpenAI serving (request parsing, detokenized streaming)"),
    ("vllm/v1/engine/", "vLLM AsyncLLM client (output processor, detokenizer)"),
    ("vllm/tokenizers", "tokenizer"),
    ("transformers/tokenization", "tokenizer"),
    ("tokenizers/", "tokenizer"),
    ("starlette/", "starlette (ASGI routing, middleware)"),
    ("fastapi/", "fastapi"),
    ("uvicorn/", "uvicorn (HTTP parsing, access log)"),
    ("h11/", "uvicorn (HTTP parsing, access log)"),
    ("httptools/", "uvicorn (HTTP parsing, access log)"),
    ("prometheus_client/", "prometheus metrics"),
    ("prometheus_fastapi_instrumentator/", "prometheus metrics"),
    ("pydantic", "pydantic (validation, serialization)"),
    ("zmq/", "ZeroMQ to the engine core"),
    ("logging/", "logging"),
    ("asyncio/", "asyncio event loop"),
)


# The threads that compute: the one running the model (execute_model) and OpenMP's workers.
COMPUTE_THREADS = ("execute_model", "kmp", "gomp")

JIT = "JIT GEMM kernels"
GGML, GGML_AREA = "ggml", "linear layers (ggml: the service's kernels)"

# Where a batch-1 decode step spends the compute threads' time (native frames; innermost known frame wins).
WORKER_AREAS: tuple[tuple[str, str | None], ...] = (
    # A frame py-spy cannot name ("0x... (?)", no module): code generated at run time, which in a CPU engine is
    # oneDNN's JIT kernels (brgemm GEMM/GEMV); unwinding stops there, so the Python caller is the next known frame.
    ("(?)", "linear layers (oneDNN JIT GEMM kernels)"),
    (GGML, GGML_AREA),
    ("jitAmdZen", "linear layers (ZenDNN JIT GEMM kernels, zentorch)"),
    ("zentorch", "linear layers (zentorch)"),
    ("dnnl", "linear layers (oneDNN GEMM)"),
    ("onednn", "linear layers (oneDNN GEMM)"),
    ("gemm", "linear layers (other GEMM)"),
    ("weight_packed_linear", "linear layers (sgl AMX GEMM)"),
    ("__kmp", "OpenMP runtime (barriers, waiting)"),
    ("kmp_", "OpenMP runtime (barriers, waiting)"),
    ("gomp", "OpenMP runtime (barriers, waiting)"),
    ("attention", "attention over the KV cache"),
    ("attn", "attention over the KV cache"),
    ("rms_norm", "elementwise (norms, rotary, activation)"),
    ("rotary", "elementwise (norms, rotary, activation)"),
    ("silu", "elementwise (norms, rotary, activation)"),
    ("act_and_mul", "elementwise (norms, rotary, activation)"),
    ("sample", "sampling and logits"),
    ("logits", "sampling and logits"),
    ("shm_broadcast", "engine-core <-> worker hand-off (shared-memory queue)"),
    ("zmq", "engine-core I/O (ZeroMQ)"),
    ("vllm/v1/core/", "scheduler"),
    ("vllm/v1/worker/", "model runner (Python: inputs, metadata)"),
    ("vllm/v1/engine/", "engine core loop (Python)"),
    ("torch/_dynamo", "torch.compile guards and wrappers"),
    ("torch/_inductor", "torch.compile generated code (fused elementwise)"),
    ("reduced_float_copy", "dtype conversions (bf16 <-> fp32 copies)"),
    ("cvt_to_fp32", "dtype conversions (bf16 <-> fp32 copies)"),
    ("cvt_from_fp32", "dtype conversions (bf16 <-> fp32 copies)"),
    ("invokeOperatorFromPython", "torch op calls from Python (dispatch, argument wrapping)"),
    ("c10::Dispatcher::callBoxed", "torch op calls from Python (dispatch, argument wrapping)"),
    ("THPVariable_", "torch op calls from Python (dispatch, argument wrapping)"),
    ("is_tensor_and_append_overloaded", "torch op calls from Python (dispatch, argument wrapping)"),
    ("check_has_torch_function", "torch op calls from Python (dispatch, argument wrapping)"),
    ("pybind11::", "torch op calls from Python (dispatch, argument wrapping)"),
    ("libtorch", "other torch operators"),
    ("at::", "other torch operators"),
)


# Whole calls whose every sample is one area, whatever kernel runs inside (the LM head is a GEMM like the layers').
OUTER_AREAS = (("compute_logits", "LM head (logits over the vocabulary)"),)


@dataclass(frozen=True)
class Areas:
    """How a profile's samples are named: `markers`, (substring of a frame, area) with the innermost known frame
    winning; `outer`, whole calls that are one area whatever runs inside; `ggml_under_op`, whether in a run on ggml
    code py-spy cannot name right under a torch op call is ggml's."""

    markers: tuple[tuple[str, str | None], ...]
    outer: tuple[tuple[str, str], ...] = ()
    ggml_under_op: bool = False


FRONT_END = Areas(AREAS)
DECODE_STEP = Areas(WORKER_AREAS, OUTER_AREAS, ggml_under_op=True)


def _stack_area(frames: list[str], areas: Areas, ggml_run: bool = False) -> str:
    """The area of the innermost frame that has one. Run-time generated code ("(?)") is oneDNN's JIT unless its
    named caller is another library's JIT kernel (ZenDNN's under zentorch), or, in a run on ggml, a torch op call."""
    for marker, outer in areas.outer:
        if any(marker in f for f in frames):
            return outer
    for i in range(len(frames) - 1, -1, -1):
        area = _area(frames[i], areas.markers)
        if area is None:
            continue
        if "(?)" in frames[i] and i > 0:
            caller = _area(frames[i - 1], areas.markers)
            if caller is not None and JIT in caller:
                return caller
            if ggml_run and areas.ggml_under_op and frames[i - 1].startswith("OpOverload.__call__"):
                return GGML_AREA
        return area
    return "other"


def _area(frame: str, areas: tuple[tuple[str, str | None], ...] = AREAS) -> str | None:
    for marker, area in areas:
        if marker in frame:
            return area  # None for the entry points every stack passes through
    return None


def code_mappings(pid: int) -> list[tuple[int, int, str]]:
    """`pid`'s executable mappings (/proc/<pid>/maps): start, end and the file's name; "" for anonymous memory (code
    generated at run time). A library loaded from memory shows as memfd:<name>, which py-spy cannot name a frame by."""
    out = []
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) < 5 or "x" not in fields[1]:
            continue
        start, end = (int(a, 16) for a in fields[0].split("-"))
        path = fields[5].removesuffix(" (deleted)") if len(fields) > 5 else ""
        out.append((start, end, path.rsplit("/", 1)[-1].removeprefix("memfd:") if not path.startswith("[") else ""))
    return out


def name_unnamed(folded: str, mappings: list[tuple[int, int, str]]) -> str:
    """Each frame py-spy left unnamed ("0x7f... (?)") that lies in a mapped file, named by that file as py-spy names
    the others ("0x7f... (libggml-cpu.so)"): the service loads ggml and its op from memory (service/cache/verified.py),
    and their frames would otherwise pass for JIT code. Frames in anonymous memory stay unnamed."""
    starts = sorted(mappings)

    def name(match: re.Match[str]) -> str:
        addr = int(match.group(1), 16)
        i = bisect.bisect_right(starts, (addr, float("inf"), "")) - 1
        if i >= 0 and starts[i][0] <= addr < starts[i][1] and starts[i][2]:
            return f"0x{match.group(1)} ({starts[i][2]})"
        return match.group(0)

    return re.sub(r"0x([0-9a-f]+) \(\?\)", name, folded)


def profile_decode(pid: int | None, run_load: Callable[[], object], out: Path) -> dict[str, Any]:
    """py-spy with native frames on `pid` (the process that runs the forward pass, compute_process()) during one more,
    uncounted batch-1 load (`run_load`): the share of the compute threads' samples in the linear layers against the
    LM head, attention, OpenMP, the hand-off from the engine core and the rest."""
    if pid is None:
        return {"error": "no vLLM engine process found under the server"}
    rec = start_record(pid, out, rate=100, native=True)
    if rec is None:
        return {"error": "py-spy not installed (pip install -e '.[bench]')"}
    try:
        time.sleep(1)
        run_load()
    finally:
        stop_record(rec)
    if not out.exists():
        return {"error": f"py-spy wrote nothing (exit {rec.returncode}); ptrace not permitted?"}
    try:
        mappings = code_mappings(pid)
    except OSError:  # the process ended with the load: its frames stay as py-spy named them
        mappings = []
    out.write_text(name_unnamed(out.read_text(), mappings))
    return summarize(out.read_text(), areas=DECODE_STEP, threads_with=COMPUTE_THREADS) | {
        "pid": pid,
        "folded": str(out),
    }


def step_line(summary: dict[str, Any], tpot_ms: float | None = None) -> str:
    """'area 38% (7.1 ms), ...': each area's share of the samples, and of a decode step where its TPOT is known."""
    return ", ".join(
        f"{area} {share:.0%}" + (f" ({share * tpot_ms:.1f} ms)" if tpot_ms else "")
        for area, share in summary["by_area"]
    )
