"""llama.cpp's own scores of a fixed text on a GGUF file: the reference the start-up check compares the engine's with
(service/policy/gguf/gguf_check.py). Taken once per converted copy and kept in it (REFERENCE), so a wrong mapping of the
user's own file shows before the service answers, not only on the files the tests cover. Starts that share the cache
take turns on a lock: the second reads the first's reference.

llama.cpp runs through its library (libllama, built with the service's kernels from the same llama.cpp tree and
recorded with them: service/kernels/ggml_build.py) and llama-cpp-python's ctypes module from that tree's sdist: the
image's (SERVICE_KERNEL_SOURCE) or the checkout's, never a path a file in the cache names. It runs in a child process
(`python -m service.models.llama_cpp_reference`): a crash in native code ends the scoring, not the start. The child
parses a file that may come from anywhere in C++, so it is confined: an environment of its own with no secret in it,
the libraries as their build recorded them (service/cache/verified.py), limits on its memory, files and tasks, no
privilege to gain, and no network where the kernel gives it namespaces of its own. The file is mapped, not read: a
large model costs its pages, not a second copy. Where llama.cpp cannot score the file (no source tree, no recorded
build, a file it refuses), the reference says why and the check is reported as not run."""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import json
import logging
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from service.cache.atomic_dir import locked, replace_file
from service.cache.verified import Unverified, open_verified
from service.facts.software import (
    CHECKOUT_SOURCE,
    GGML_KERNEL_BUILT,
    GGML_KERNEL_DIR,
    KERNEL_SOURCE,
    LLAMA_FILES,
    kernel_record,
)

log = logging.getLogger("service.gguf")

REFERENCE = "llama_cpp_reference.json"
# Plain prose every tokenizer splits into ordinary words: a mapping that is wrong anywhere (a norm's offset, a scale,
# a rotary layout, a swapped projection) moves the next-token scores of every position.
TEXT = (
    "The library opens at nine in the morning and closes at six in the evening. On Saturdays it closes at noon, and "
    "on Sundays it stays closed. Children under twelve may borrow three books at a time; adults may borrow ten. A "
    "book that comes back late costs ten cents a day."
)
MAX_TOKENS = 64
SCORE_TIMEOUT_S = 1800
CHILD = "service.models.llama_cpp_reference"
SERVICE_ROOT = Path(__file__).resolve().parents[2]  # where `python -m` finds the service
# What the child keeps of this process's environment: the locale (its arguments' encoding) and PATH. Not HOME or
# TMPDIR: it writes no file.
KEPT_ENV = ("PATH", "LANG", "LANGUAGE")
# Its memory beyond the file's size (the file mapped read-only is not counted; read, it is): the vocabulary, a
# context of MAX_TOKENS, the scores, Python and numpy (SmolLM2-135M's took less than 256 MiB), and per thread its
# stack (8 MiB) and its allocator's first pages. A header that asks for more is refused.
MEMORY_BEYOND_FILE = 2 << 30
MEMORY_PER_THREAD = 16 << 20
SPARE_TASKS = 16  # tasks beyond ggml's threads: the main thread and the few a runtime starts
CLONE_NEWUSER, CLONE_NEWNET = 0x10000000, 0x40000000  # <sched.h>
PR_SET_NO_NEW_PRIVS = 38  # <linux/prctl.h>


class ReferenceUnavailable(RuntimeError):
    pass


def library_dir(kernel_dir: Path = GGML_KERNEL_DIR) -> Path:
    return kernel_dir / "build" / "bin"


def source_tree(environ_source: Path | None = KERNEL_SOURCE, checkout: Path = CHECKOUT_SOURCE) -> Path | None:
    """The llama.cpp tree the kernels and libllama are built from: the image's (SERVICE_KERNEL_SOURCE), else the
    checkout's (`make setup` extracts it). Not one the kernels' stamp names: the stamp is in the cache, and the
    bindings it would point at run as code."""
    return environ_source or (checkout if checkout.is_dir() else None)


def ensure_reference(gguf: Path, converted: Path) -> dict[str, Any]:
    """llama.cpp's reference for `gguf`, kept in its converted copy (`converted`/REFERENCE): the text's token ids and,
    at each position, the log-probability llama.cpp gives the next token and its top token. Taken where the copy has
    none yet, under a lock on it (service/cache/atomic_dir.py): a start that waited reads the reference taken
    meanwhile. Where llama.cpp cannot score the file the copy holds {"unavailable": why}, taken again at the next start
    (an image builds its kernels, and with them llama.cpp's library, at its first start on a CPU, after a `pull`)."""
    path = converted / REFERENCE
    if (kept := _kept(path)) is not None:
        return kept
    with contextlib.ExitStack() as held:
        with contextlib.suppress(OSError):  # a read-only cache: scored alone, and _keep says it is not kept
            held.enter_context(locked(path))
        if (kept := _kept(path)) is not None:
            return kept
        result = _taken(gguf)
        _keep(path, result, converted)
    return result


def _kept(path: Path) -> dict[str, Any] | None:
    """The reference kept at `path`; None where there is none, or one that says why it was not taken."""
    try:
        kept = _json_object(path.read_text())
    except OSError:
        return None
    return kept if kept is not None and "unavailable" not in kept else None


def _json_object(text: str) -> dict[str, Any] | None:
    try:
        found = json.loads(text)
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


def _taken(gguf: Path) -> dict[str, Any]:
    started = time.monotonic()
    try:
        result = _score(gguf)
        log.info("GGUF %s: llama.cpp scored the check's text in %.1f s", gguf, time.monotonic() - started)
    except ReferenceUnavailable as exc:
        result = {"unavailable": str(exc)}
        log.warning("GGUF %s: llama.cpp's reference scores not taken: %s", gguf, exc)
    return result


def _keep(path: Path, result: dict[str, Any], converted: Path) -> None:
    try:
        replace_file(path, json.dumps(result).encode())  # whole or absent: another start may read it now
    except OSError as exc:  # a read-only cache: the check still runs on this start's scores
        log.warning("llama.cpp's reference scores not kept in %s: %s", converted, exc)


def _score(gguf: Path) -> dict[str, Any]:
    tree = source_tree()
    if tree is None or not (tree / "CMakeLists.txt").is_file():
        raise ReferenceUnavailable("no llama.cpp source tree (make setup extracts one; the images carry one)")
    bindings = tree.parents[1] / "llama_cpp" / "llama_cpp.py"
    if not bindings.is_file():
        raise ReferenceUnavailable(f"llama-cpp-python's bindings are not beside {tree} ({bindings})")
    with linked_libraries() as (libraries, fds):
        return run_child(gguf, bindings, libraries, fds)


@contextlib.contextmanager
def linked_libraries(stamp: Path = GGML_KERNEL_BUILT) -> Iterator[tuple[Path, list[int]]]:
    """llama.cpp's libraries as the kernels' build recorded them: each checked and held in memory (a memfd), linked
    from a private folder by the name the child loads it by. The child inherits the memfds, and each link resolves to
    the child's own copy (/proc/self/fd/<fd>)."""
    recorded = kernel_record(stamp)
    if not recorded:
        raise ReferenceUnavailable(
            "llama.cpp's library is built with the service's kernels, and they are not built for this CPU or recorded "
            "no sha256 (make kernels; an image builds them at its next start)"
        )
    try:
        fds = open_verified(stamp.parents[1], recorded, LLAMA_FILES)
    except Unverified as exc:
        raise ReferenceUnavailable(
            f"{exc}: not loaded (make kernels; an image rebuilds them at its next start)"
        ) from exc
    try:
        with tempfile.TemporaryDirectory(prefix="llama-cpp-") as links:
            for name, fd in zip(LLAMA_FILES, fds, strict=True):
                os.symlink(f"/proc/self/fd/{fd}", Path(links) / Path(name).name)
            yield Path(links), fds
    finally:
        for fd in fds:
            os.close(fd)


def run_child(gguf: Path, bindings: Path, libraries: Path, fds: Sequence[int]) -> dict[str, Any]:
    """What the child (CHILD) prints, run on `gguf` with the `bindings` and the `libraries` folder, inheriting `fds`:
    in the environment of child_env, confined by `confine`."""
    threads = len(os.sched_getaffinity(0))  # the child's ggml threads
    notes, notes_to = os.pipe()
    try:
        done = subprocess.run(
            [sys.executable, "-E", "-s", "-m", CHILD, str(gguf)],  # -E -s: no PYTHON* variable, no user site
            cwd=SERVICE_ROOT,
            env=child_env(os.environ, libraries, bindings),
            pass_fds=fds,
            preexec_fn=confine(child_limits(gguf, threads), threads + SPARE_TASKS, notes_to),
            capture_output=True,
            text=True,
            timeout=SCORE_TIMEOUT_S,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise ReferenceUnavailable(f"llama.cpp's scoring did not finish: {exc}") from exc
    finally:
        os.close(notes_to)
        _say_refused(os.read(notes, 64))
        os.close(notes)
    if done.returncode != 0:
        raise ReferenceUnavailable(f"llama.cpp exited with {done.returncode}: {done.stderr.strip()[-1500:]}")
    scores = _json_object(done.stdout)
    if scores is None:
        raise ReferenceUnavailable(f"llama.cpp's child printed no scores: {done.stdout[-300:]!r}")
    return scores


def child_env(environ: Mapping[str, str], libraries: Path, bindings: Path) -> dict[str, str]:
    """The child's whole environment: KEPT_ENV and the locale of `environ`, and what the child reads. No key, token,
    proxy (or its credentials) or setting of the service's. One BLAS thread: numpy only exponentiates there. No
    backtrace on a failed assertion: ggml would start gdb on itself, and its lines would push the reason out of the
    error's tail."""
    kept = {name: value for name, value in environ.items() if name in KEPT_ENV or name.startswith("LC_")}
    return {
        **kept,
        "LLAMA_CPP_LIB_PATH": str(libraries),
        "SERVICE_LLAMA_CPP_BINDINGS": str(bindings),
        "OPENBLAS_NUM_THREADS": "1",
        "GGML_NO_BACKTRACE": "1",
    }


def child_limits(gguf: Path, threads: int) -> list[tuple[int, int]]:
    """(resource, limit) of the child, each at most this process's hard limit (no process may raise one)."""
    wanted = [
        (resource.RLIMIT_DATA, gguf.stat().st_size + MEMORY_BEYOND_FILE + threads * MEMORY_PER_THREAD),
        (resource.RLIMIT_FSIZE, 0),  # it writes no file: not to the cache it could otherwise reach
        (resource.RLIMIT_CORE, 0),
    ]
    return [(which, _at_most_hard(which, value)) for which, value in wanted]


def _at_most_hard(which: int, value: int) -> int:
    hard = resource.getrlimit(which)[1]
    return value if hard == resource.RLIM_INFINITY else min(value, hard)


def confine(limits: Sequence[tuple[int, int]], tasks: int, notes: int) -> Callable[[], None]:
    """The child's set-up between fork and exec: no privilege to gain (through a setuid program), a user and a network
    namespace of its own (no network) where the kernel and the container allow it, else the refusal's errno written to
    `notes`; then `limits`, and at most `tasks` tasks where the kernel counts them in that namespace alone (Linux 5.14
    on; before, the count is the user's across the machine, which a start cannot know)."""
    libc = ctypes.CDLL(None, use_errno=True)
    prctl, unshare = libc.prctl, libc.unshare  # looked up before the fork: the child only calls them
    tasks = _at_most_hard(resource.RLIMIT_NPROC, tasks)
    counted_apart = _tasks_counted_per_namespace(os.uname().release)

    def preexec() -> None:
        prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
        if unshare(CLONE_NEWUSER | CLONE_NEWNET) != 0:
            os.write(notes, str(ctypes.get_errno()).encode())
        elif counted_apart:
            resource.setrlimit(resource.RLIMIT_NPROC, (tasks, tasks))
        for which, value in limits:
            resource.setrlimit(which, (value, value))

    return preexec


def _tasks_counted_per_namespace(release: str) -> bool:
    found = re.match(r"(\d+)\.(\d+)", release)
    return found is not None and (int(found[1]), int(found[2])) >= (5, 14)


def _say_refused(note: bytes) -> None:
    if note:
        log.info(
            "llama.cpp's child runs with this process's network: the kernel or the container refused it namespaces "
            "of its own (unshare: %s); its environment holds no secret and its limits hold",
            os.strerror(int(note)),
        )


# --- in the child process -------------------------------------------------------------------------------------------


def bindings(path: Path) -> Any:
    """llama-cpp-python's ctypes module alone (its package __init__ imports the high-level API and diskcache),
    quietened, with the backend initialised."""
    package = types.ModuleType("llama_cpp")
    package.__path__ = [str(path.parent)]
    sys.modules["llama_cpp"] = package
    spec = importlib.util.spec_from_file_location("llama_cpp.llama_cpp", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    module.llama_backend_init()
    module._quiet = module.llama_log_callback(lambda level, text, data: None)  # kept: C holds the pointer
    module.llama_log_set(module._quiet, None)
    return module


def load_model(lib: Any, path: str, mmap: bool = True) -> Any:
    """The file on llama.cpp's plain CPU kernels: its extra buffer types (weights repacked for AVX2, AVX-512 or AMX)
    differ from one CPU to the next, and on an Emerald Rapids guest its AMX kernel died of SIGILL at its first tile
    load (`tileloadd`; llama.cpp PR #26954 describes such a fault), which left the check not run there."""
    params = lib.llama_model_default_params()
    params.use_mmap = mmap
    params.use_extra_bufts = False
    model = lib.llama_model_load_from_file(path.encode(), params)
    if not model:
        raise SystemExit(f"llama.cpp could not load {path}")
    return model


def token_ids(lib: Any, vocab: Any, text: str) -> list[int]:
    """llama.cpp's token ids for `text`, with the BOS the file asks for, special tokens read as text."""
    raw = text.encode()
    room = len(raw) + 8
    ids = (lib.llama_token * room)()
    n = lib.llama_tokenize(vocab, raw, len(raw), ids, room, True, False)
    return list(ids[:n])


def log_softmax_rows(lib: Any, model: Any, tokens: list[int], threads: int) -> Any:
    """llama.cpp's log-softmax over the vocabulary at every position of `tokens` (row j scores token j+1), in fp32:
    an fp32 KV cache and no flash attention (its CPU path rounds Q and K to fp16), as the service's fp32 engine runs."""
    import numpy as np

    n_vocab = lib.llama_vocab_n_tokens(lib.llama_model_get_vocab(model))
    params = lib.llama_context_default_params()
    params.n_ctx = params.n_batch = params.n_ubatch = len(tokens) + 8
    params.n_threads = params.n_threads_batch = threads
    params.type_k = params.type_v = 0  # GGML_TYPE_F32
    params.flash_attn_type = 0
    context = lib.llama_init_from_model(model, params)
    batch = lib.llama_batch_init(len(tokens), 0, 1)
    for j, token in enumerate(tokens):
        batch.token[j], batch.pos[j], batch.n_seq_id[j], batch.logits[j] = token, j, 1, True
        batch.seq_id[j][0] = 0
    batch.n_tokens = len(tokens)
    if lib.llama_decode(context, batch) != 0:
        raise SystemExit("llama_decode failed")
    logits = lib.llama_get_logits(context)
    scores = np.ctypeslib.as_array(ctypes.cast(logits, ctypes.POINTER(ctypes.c_float)), (len(tokens), n_vocab))
    scores = scores.astype(np.float64)
    top = scores.max(axis=-1, keepdims=True)
    rows = scores - top - np.log(np.exp(scores - top).sum(axis=-1, keepdims=True))
    lib.llama_batch_free(batch)
    lib.llama_free(context)
    return rows


def preload(libraries: Path) -> None:
    """ggml's libraries from `libraries`, in their order: libllama then finds them loaded (by soname) instead of
    looking in its build tree (its runpath), whose files were not checked."""
    for name in LLAMA_FILES[:-1]:
        ctypes.CDLL(str(libraries / Path(name).name), mode=ctypes.RTLD_GLOBAL)


def _child_score(gguf: str) -> None:
    preload(Path(os.environ["LLAMA_CPP_LIB_PATH"]))
    lib = bindings(Path(os.environ["SERVICE_LLAMA_CPP_BINDINGS"]))
    model = load_model(lib, gguf)
    tokens = token_ids(lib, lib.llama_model_get_vocab(model), TEXT)[:MAX_TOKENS]
    rows = log_softmax_rows(lib, model, tokens, len(os.sched_getaffinity(0)))
    lib.llama_model_free(model)
    following = tokens[1:]
    print(
        json.dumps(
            {
                "text": TEXT,
                "tokens": tokens,
                "logprobs": [float(rows[j, t]) for j, t in enumerate(following)],
                "top": [int(rows[j].argmax()) for j in range(len(following))],
            }
        )
    )


if __name__ == "__main__":
    _child_score(sys.argv[1])
