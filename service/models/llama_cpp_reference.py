"""llama.cpp's own scores of a fixed text on a GGUF file: the reference the start-up check compares the engine's with
(service/policy/gguf_check.py). Taken once per converted copy and kept in it (REFERENCE), so a wrong mapping of the
user's own file shows before the service answers, not only on the files the tests cover.

llama.cpp runs through its library (libllama, built beside the service's ggml kernels from the same llama.cpp tree:
`ninja llama` in their build directory, about a minute on 2 cores, once) and llama-cpp-python's ctypes module from
that tree's sdist, in a child process (`python -m service.models.llama_cpp_reference`): a crash in native code ends
the scoring, not the start. The file is mapped, not read: a large model costs its pages, not a second copy.
Where llama.cpp cannot score the file (no source tree, a build that fails, a file it refuses), the reference says why
and the check is reported as not run."""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any

from service.facts.software import GGML_KERNEL_BUILT, GGML_KERNEL_DIR, KERNEL_SOURCE
from service.kernels.ggml_build import beside_python

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
BUILD_TIMEOUT_S = 1800


class ReferenceUnavailable(RuntimeError):
    pass


def library_dir(kernel_dir: Path = GGML_KERNEL_DIR) -> Path:
    return kernel_dir / "build" / "bin"


def source_tree(stamp: Path = GGML_KERNEL_BUILT, environ_source: Path | None = KERNEL_SOURCE) -> Path | None:
    """The llama.cpp tree the kernels were built from (their stamp names it), else the images' source."""
    try:
        tree = json.loads(stamp.read_text()).get("tree")
    except (OSError, ValueError):
        tree = None
    return Path(tree) if tree else environ_source


def ensure_reference(gguf: Path, converted: Path) -> dict[str, Any]:
    """llama.cpp's reference for `gguf`, kept in its converted copy (`converted`/REFERENCE): the text's token ids and,
    at each position, the log-probability llama.cpp gives the next token and its top token. Taken where the copy has
    none yet. Where llama.cpp cannot score the file the copy holds {"unavailable": why}, taken again at the next start
    (an image builds its kernels, and with them llama.cpp's library, at its first start on a CPU, after a `pull`)."""
    path = converted / REFERENCE
    try:
        kept = json.loads(path.read_text())
        if "unavailable" not in kept:
            return kept
    except (OSError, ValueError):
        pass
    started = time.monotonic()
    try:
        result = _score(gguf)
        log.info("GGUF %s: llama.cpp scored the check's text in %.1f s", gguf, time.monotonic() - started)
    except ReferenceUnavailable as exc:
        result = {"unavailable": str(exc)}
        log.warning("GGUF %s: llama.cpp's reference scores not taken: %s", gguf, exc)
    staged = path.with_name(f".{REFERENCE}.{os.getpid()}")
    try:
        staged.write_text(json.dumps(result))
        os.replace(staged, path)  # whole or absent: another start may read it now
    except OSError as exc:  # a read-only cache: the check still runs on this start's scores
        log.warning("GGUF %s: llama.cpp's reference scores not kept in %s: %s", gguf, converted, exc)
    return result


def _score(gguf: Path) -> dict[str, Any]:
    tree = source_tree()
    if tree is None or not (tree / "CMakeLists.txt").is_file():
        raise ReferenceUnavailable("no llama.cpp source tree (make kernels; the images carry one)")
    bindings = tree.parents[1] / "llama_cpp" / "llama_cpp.py"
    if not bindings.is_file():
        raise ReferenceUnavailable(f"llama-cpp-python's bindings are not beside {tree} ({bindings})")
    libraries = library_dir()
    if not (libraries / "libllama.so").is_file():
        _build_library(libraries.parent)
    env = {**os.environ, "LLAMA_CPP_LIB_PATH": str(libraries), "SERVICE_LLAMA_CPP_BINDINGS": str(bindings)}
    try:
        done = subprocess.run(
            [sys.executable, "-m", "service.models.llama_cpp_reference", str(gguf)],
            env=env,
            capture_output=True,
            text=True,
            timeout=SCORE_TIMEOUT_S,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ReferenceUnavailable(f"llama.cpp's scoring did not finish: {exc}") from exc
    if done.returncode != 0:
        raise ReferenceUnavailable(f"llama.cpp exited with {done.returncode}: {done.stderr.strip()[-1500:]}")
    return json.loads(done.stdout)


def _build_library(build_dir: Path) -> None:
    if not (build_dir / "build.ninja").is_file():
        raise ReferenceUnavailable(f"the kernels' build tree is not at {build_dir} (make kernels)")
    log.warning("building llama.cpp's library in %s for the GGUF check: once, about a minute on 2 cores", build_dir)
    try:
        subprocess.run(
            [beside_python("ninja"), "-C", str(build_dir), "llama"],
            check=True,
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT_S,
        )
    except subprocess.CalledProcessError as exc:
        raise ReferenceUnavailable(f"building libllama failed: {(exc.stderr or exc.stdout)[-1500:]}") from exc
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ReferenceUnavailable(f"building libllama failed: {exc}") from exc


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
    import ctypes

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


def _child_score(gguf: str) -> None:
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
