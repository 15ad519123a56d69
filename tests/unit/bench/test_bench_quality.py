"""bench/parts/quality.py scores the tokens llama-perplexity scores."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from bench.parts.quality import chunks_of, second_half


def test_chunks_are_llama_perplexitys():
    ids = list(range(100, 110))
    assert chunks_of(ids, 4, bos=None) == [[100, 101, 102, 103], [104, 105, 106, 107]]  # a partial chunk is dropped
    assert chunks_of(ids, 4, bos=1) == [[1, 101, 102, 103], [1, 105, 106, 107]]


def test_the_second_half_of_a_chunk_is_scored():
    # logprobs[k] is the logprob of token k + 1; llama-perplexity scores tokens first + 1 .. ctx - 1, first = ctx / 2.
    ctx = 8
    logprobs = [float(token) for token in range(1, ctx)]
    assert second_half(logprobs, ctx) == [5.0, 6.0, 7.0]


FAKE_LLAMA_PERPLEXITY = """#!{python}
import os, signal
if os.environ.get("LLAMA_ARG_REPACK") != "0":  # as llama.cpp's AMX path did in guests, while loading
    os.kill(os.getpid(), signal.{signal})
print("Final estimate: PPL = 12.3456 +/- 0.4321")
"""


@pytest.mark.parametrize("crash", ["SIGILL", "SIGSEGV"])
def test_a_llama_perplexity_that_crashes_while_loading_runs_again_with_repacking_off_and_says_so(
    tmp_path, monkeypatch, crash
):
    from bench.parts import quality

    fake = tmp_path / "llama-perplexity"
    fake.write_text(FAKE_LLAMA_PERPLEXITY.format(python=sys.executable, signal=crash))
    fake.chmod(0o755)
    monkeypatch.setattr(quality, "BIN", tmp_path)
    monkeypatch.delenv("LLAMA_ARG_REPACK", raising=False)
    ppl, error, repack_off = quality._llama_perplexity(tmp_path / "m.gguf", tmp_path / "t.txt", 256, 2, 1)
    assert (ppl, error) == (12.3456, 0.4321)
    assert repack_off is not None and crash in repack_off
    row = quality.QualityResult("m.gguf", 256, 2, 256, True, ppl, error, 12.0, 12.1, "float32", repack_off)
    assert "LLAMA_ARG_REPACK=0" in row.markdown()
    # A user's own setting is left as it is: the crash is the bench's error then.
    monkeypatch.setenv("LLAMA_ARG_REPACK", "1")
    with pytest.raises(subprocess.CalledProcessError) as failed:
        quality._llama_perplexity(tmp_path / "m.gguf", tmp_path / "t.txt", 256, 2, 1)
    assert failed.value.returncode == -int(getattr(signal, crash))


def test_a_llama_perplexity_that_loads_keeps_repacking_on(tmp_path, monkeypatch):
    from bench.parts import quality

    fake = tmp_path / "llama-perplexity"
    fake.write_text(f"#!{sys.executable}\nprint('Final estimate: PPL = 9.5 +/- 0.25')\n")
    fake.chmod(0o755)
    monkeypatch.setattr(quality, "BIN", tmp_path)
    assert quality._llama_perplexity(tmp_path / "m.gguf", tmp_path / "t.txt", 256, 2, 1) == (9.5, 0.25, None)
    row = quality.QualityResult("m.gguf", 256, 2, 256, True, 9.5, 0.25, 9.0, 9.1, "float32")
    assert "LLAMA_ARG_REPACK" not in row.markdown()
