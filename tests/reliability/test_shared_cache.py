"""Two replicas on one cache (a ReadWriteMany volume): each service pid 1 of its own pid namespace (`unshare --pid
--fork`, as in containers), the same GGUF file, the first replica's conversion stopped mid-way while the second
starts. Staging by pid let the second delete the first's live staging directory and mix their shards; now the
second waits on the build's lock, both come up and answer as the file's model, and the cache holds one complete
conversion."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import time
from pathlib import Path

import pytest
from openai import OpenAI

from harness import SERVICE_ARGV, ServerProcess
from service.cache.atomic_dir import finished_problem
from service.models.gguf_convert import PROVENANCE
from tests.integration.test_reference import TEXTS
from tests.support.gguf_models import tiny_gguf
from tests.support.reference import compare, prompt_ids, query, reference_logprobs
from tests.support.release import reap
from tests.support.server import MODELS, service_env

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None, reason="a pid namespace needs root and unshare (CI has both)"
)
SERVED = "tiny-qwen3-Q4_K-v1"
MAX_DIFF, MEAN_DIFF = 0.01, 0.001  # fp32 against fp32, as tests/integration/test_gguf_file.py


def _replica(tmp_path: Path, cache: Path, name: str) -> ServerProcess:
    env = service_env(
        cache,
        model=str(tiny_gguf(MODELS, "qwen3", "Q4_K")),
        dtype="float32",
        gguf_blocks="off",
        build_kernels="off",
        kv_cache_gib="0.25",
        # Two engines at once beside the other stream's: a 2 MB model needs no more than this kept free.
        memory_headroom_gib="0.5",
        max_model_len="512",
    )
    # --mount-proc: as in a container, /proc shows the namespace's own pids (vLLM reads /proc/<pid>/status).
    argv = ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", *SERVICE_ARGV]
    return ServerProcess(env, tmp_path / f"{name}.log", argv=argv, name=f"shared-cache/{name}")


def _building(gguf_dir: Path) -> bool:
    """A staging directory is there: made only once its builder holds the lock. (The lock file is not a sign: it is
    created a moment before the lock is taken, and a replica stopped in that moment holds nothing.)"""
    try:
        return any(e.name.endswith(".partial") for e in os.scandir(gguf_dir))
    except FileNotFoundError:
        return False


def test_two_replicas_in_two_pid_namespaces_convert_once_into_one_cache(tmp_path):
    cache = tmp_path / "cache"
    gguf_dir = cache / "models" / "gguf"
    reap()
    first = _replica(tmp_path, cache, "first").start()
    second = None
    try:
        deadline = time.monotonic() + 300
        while not _building(gguf_dir):  # its conversion under way: stop the whole replica there
            assert first.proc.poll() is None and time.monotonic() < deadline, first.log_tail()
            time.sleep(0.001)
        os.killpg(first.pid, signal.SIGSTOP)
        held = sorted(p.name for p in gguf_dir.iterdir())
        assert any(name.endswith(".partial") for name in held), held  # stopped mid-way, not after its rename
        second = _replica(tmp_path, cache, "second").start()
        while "waiting for another build of" not in second.log_path.read_text(errors="replace"):
            assert second.proc.poll() is None and time.monotonic() < deadline, second.log_tail()
            time.sleep(0.1)
        os.killpg(first.pid, signal.SIGCONT)
        first.wait_ready(timeout=480)
        second.wait_ready(timeout=480)

        (target,) = [p for p in gguf_dir.iterdir() if not p.name.startswith(".")]
        assert finished_problem(target, PROVENANCE) is None, held
        assert [p.name for p in gguf_dir.iterdir() if p.name.endswith((".partial", ".stale"))] == []
        logs = first.log_tail(10**6) + second.log_tail(10**6)
        assert logs.count("converted in") == 1 and "using the copy another start converted" in logs, held
        for replica in (first, second):
            client = OpenAI(base_url=f"{replica.url}/v1", api_key="unused", max_retries=0)
            served = [query(client, SERVED, ids, 8) for ids in prompt_ids(str(target), TEXTS)]
            reference = reference_logprobs(str(target), [s.prompt + s.tokens for s in served])
            result = compare(served, reference, 2 * MAX_DIFF, 0.02)
            assert result.top1_equal + result.near_ties == result.greedy and result.passes(MAX_DIFF, MEAN_DIFF), result
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(first.pid, signal.SIGCONT)
        first.kill_group()
        if second is not None:
            second.kill_group()
