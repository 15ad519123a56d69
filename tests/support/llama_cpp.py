"""llama.cpp itself, the reference a GGUF file's answers are checked against: its library (libllama, built by
`make llama-lib` from the same llama.cpp source as the service's kernels, in their build tree) through
llama-cpp-python's own ctypes bindings from that source's sdist, and its converter (convert_hf_to_gguf.py).
Each call runs in a process of its own (`python -m tests.support.llama_cpp`): a crash in native code fails the test
that asked, not the session.

- `convert(hf_dir, out, pre)`: llama.cpp's converter on a Hugging Face checkpoint, in F32, as users' files are made
  (the architecture's own tensor edits: llama's Q/K rows permuted, Gemma's norms stored plus one, ...). `pre` names
  the BPE pre-tokenizer, which the converter otherwise recognises only by a hash of a known model's tokenizer.
- `quantize(gguf, out, ftype)`: llama.cpp's quantizer (`llama-quantize --pure`): every 2-D tensor in one type, the
  token embedding and the output included, as `ftype` names it (a LLAMA_FTYPE_MOSTLY_* name: "Q8_0").
- `logprobs(gguf, sequences)`: llama.cpp's log-softmax at every position of each sequence (a `Reference` of
  tests/support/reference.py, row j scoring token j+1), in fp32 with one thread.
- `tokenize(gguf, texts)`: llama.cpp's token ids for each text, with the BOS the file asks for."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from service.models.llama_cpp_reference import bindings, library_dir, load_model, log_softmax_rows, token_ids

REPO = Path(__file__).resolve().parents[2]
# mk/bench.mk's LLAMA_CPP_SDIST, extracted by `make setup` (the kernels are built from it).
SOURCE = REPO / ".cache" / "bench-src" / "llama_cpp_python-0.3.36"
TREE = SOURCE / "vendor" / "llama.cpp"
LIBRARY_DIR = library_dir()  # mk/kernels.mk's LLAMA_LIB


def _run(*args: str, timeout: float = 600) -> str:
    env = {**os.environ, "LLAMA_CPP_LIB_PATH": str(LIBRARY_DIR), "NO_LOCAL_GGUF": ""}
    out = subprocess.run(
        [sys.executable, "-m", "tests.support.llama_cpp", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if out.returncode != 0:
        raise RuntimeError(f"llama.cpp ({args[0]}) exited with {out.returncode}:\n{out.stderr[-4000:]}")
    return out.stdout


def convert(hf_dir: Path, out: Path, pre: str) -> Path:
    _run("convert", str(hf_dir), str(out), pre)
    return out


def quantize(gguf: Path, out: Path, ftype: str) -> Path:
    _run("quantize", str(gguf), str(out), ftype)
    return out


def logprobs(gguf: Path, sequences: list[tuple[int, ...]]):
    """llama.cpp's log-softmax over the vocabulary at every position of each sequence."""
    import numpy as np
    import torch

    from tests.support.reference import Reference

    with tempfile.TemporaryDirectory() as scratch:
        request = Path(scratch) / "sequences.json"
        request.write_text(json.dumps([list(s) for s in sequences]))
        _run("logprobs", str(gguf), str(request), scratch)
        rows = [np.load(Path(scratch) / f"{i}.npy") for i in range(len(sequences))]
    return [Reference(torch.from_numpy(r), torch.full((r.shape[0],), torch.inf)) for r in rows]


def tokenize(gguf: Path, texts: list[str]) -> list[list[int]]:
    return json.loads(_run("tokenize", str(gguf), json.dumps(texts)))


# --- in the child process -------------------------------------------------------------------------------------------


def _bindings():
    return bindings(SOURCE / "llama_cpp" / "llama_cpp.py")


def _child_convert(hf_dir: str, out: str, pre: str) -> None:
    import runpy

    sys.path[:0] = [str(TREE), str(TREE / "gguf-py")]
    from conversion.base import TextModel  # type: ignore[import-not-found]

    TextModel.get_vocab_base_pre = lambda self, tokenizer: pre
    sys.argv = ["convert_hf_to_gguf.py", hf_dir, "--outtype", "f32", "--outfile", out]
    runpy.run_path(str(TREE / "convert_hf_to_gguf.py"), run_name="__main__")


def _child_quantize(path: str, out: str, ftype: str) -> None:
    lib = _bindings()
    params = lib.llama_model_quantize_default_params()
    params.ftype = getattr(lib, f"LLAMA_FTYPE_MOSTLY_{ftype}")
    params.pure = True
    params.nthread = 1
    if lib.llama_model_quantize(path.encode(), out.encode(), params) != 0:
        raise SystemExit(f"llama.cpp could not quantize {path} to {ftype}")


def _child_logprobs(path: str, request: str, out_dir: str) -> None:
    import numpy as np

    lib = _bindings()
    model = load_model(lib, path, mmap=False)
    for i, tokens in enumerate(json.loads(Path(request).read_text())):
        np.save(Path(out_dir) / f"{i}.npy", log_softmax_rows(lib, model, tokens, threads=1))
    lib.llama_model_free(model)


def _child_tokenize(path: str, texts: str) -> None:
    lib = _bindings()
    model = load_model(lib, path, mmap=False)
    vocab = lib.llama_model_get_vocab(model)
    print(json.dumps([token_ids(lib, vocab, text) for text in json.loads(texts)]))
    lib.llama_model_free(model)


if __name__ == "__main__":
    command, *arguments = sys.argv[1:]
    {
        "convert": _child_convert,
        "quantize": _child_quantize,
        "logprobs": _child_logprobs,
        "tokenize": _child_tokenize,
    }[command](*arguments)
