"""py-spy while the load runs: on the front end (the API server process), what Python dominates; on the engine's
compute process during batch-1 decode (with native frames), where a decode step's time goes."""

from __future__ import annotations

import collections
import shutil
import subprocess
import sys
from pathlib import Path


def py_spy() -> str | None:
    here = Path(sys.executable).parent / "py-spy"
    return str(here) if here.exists() else shutil.which("py-spy")


def start_record(pid: int, out: Path, rate: int = 200, native: bool = False) -> subprocess.Popen | None:
    """Collapsed stacks (one 'frame;frame;... count' line per stack) of `pid` only, GIL idle excluded. Native frames
    need the process paused per sample (py-spy refuses --native with --nonblocking): a profiled run is uncounted."""
    exe = py_spy()
    if exe is None:
        return None
    mode = ["--native"] if native else ["--nonblocking"]
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
                    return child.pid
            except psutil.NoSuchProcess:
                continue
    return None


def stop_record(proc: subprocess.Popen | None) -> None:
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


def summarize(folded: str, top: int = 15, areas: tuple[tuple[str, str | None], ...] | None = None) -> dict:
    """Self time per function, and samples by area (innermost frame with a known area), as fractions."""
    self_count: collections.Counter[str] = collections.Counter()
    area_count: collections.Counter[str] = collections.Counter()
    total = 0
    for line in folded.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = [f for f in stack.split(";") if f]
        if frames:
            self_count[_frame_name(frames[-1])] += n
        # Each sample goes to the area of its innermost frame that has one: a partition that sums to 100%.
        area = next((a for a in (_area(f, areas or AREAS) for f in reversed(frames)) if a), "other")
        area_count[area] += n
    if not total:
        return {"samples": 0, "self": [], "by_area": []}
    return {
        "samples": total,
        "self": [(name, n / total) for name, n in self_count.most_common(top)],
        "by_area": [(name, n / total) for name, n in area_count.most_common()],
    }


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


# Where a batch-1 decode step spends the compute process's time (native frames; innermost known frame wins). oneDNN's
# JIT-generated kernels have no symbol: their samples land on the dnnl:: frame that called them.
WORKER_AREAS: tuple[tuple[str, str | None], ...] = (
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
    ("libtorch", "other torch operators"),
    ("at::", "other torch operators"),
)


def _area(frame: str, areas: tuple[tuple[str, str | None], ...] = AREAS) -> str | None:
    for marker, area in areas:
        if marker in frame:
            return area  # None for the entry points every stack passes through
    return None
