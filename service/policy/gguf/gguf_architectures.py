"""Which GGUF architectures the service serves: those a test has checked against llama.cpp on the same file.
transformers' GGUF mapping reads more (gemma2/3, phi3, stablelm, ...), but reading is not serving right: a gemma3
file it maps served garbage without a word (its norms stored plus one, soft-capping and sliding-window settings the
mapping drops). An architecture outside this table is refused before the engine starts, unless the user
asks for it (gguf_unchecked=serve), and then the report warns that its answers are unchecked. Every file served is
checked once more at start, on the user's own file (service/policy/gguf/gguf_check.py)."""

from __future__ import annotations

# general.architecture -> the tests that check a file of it against llama.cpp on the same file (greedy tokens and
# logprobs): every one in tests/integration/test_gguf_llama_cpp.py, a tiny file written by llama.cpp's converter.
_TINY = "tests/integration/test_gguf_llama_cpp.py (a tiny file from llama.cpp's converter)"
CHECKED = {
    "llama": (
        f"{_TINY}, tests/integration/test_real_model_quality.py (SmolLM2-135M-Instruct's own Q4_1/Q8_0 file served "
        "on its blocks)"
    ),
    "gemma2": (
        f"{_TINY}, with the settings service/policy/gguf/gguf_config.py mends; its Q8_0 blocks through the engine, "
        "test_gguf_blocks_llama_cpp.py"
    ),
    "gemma3": (
        f"{_TINY}, with the settings service/policy/gguf/gguf_config.py mends; its Q8_0 blocks through the engine, "
        "test_gguf_blocks_llama_cpp.py"
    ),
    "phi3": (
        f"{_TINY}; its Q8_0 blocks through the engine, test_gguf_blocks_llama_cpp.py; a file with LongRoPE factors is refused "
        "(service/policy/gguf/gguf_rope.py)"
    ),
    "qwen2": _TINY,
    "qwen2moe": (
        f"{_TINY}, with the settings service/policy/gguf/gguf_config.py mends; its Q8_0 attention and shared expert blocks "
        "through the engine, test_gguf_blocks_llama_cpp.py"
    ),
    "qwen3": _TINY,
    "qwen3moe": (
        f"{_TINY}, with the settings service/policy/gguf/gguf_config.py mends; its Q8_0 attention blocks through the "
        "engine, test_gguf_blocks_llama_cpp.py"
    ),
}


def architecture_problem(architecture: str, serve_unchecked: bool) -> tuple[str | None, str | None]:
    """(error, warning) for a GGUF file of `architecture`: refused unless checked or the user asked for it."""
    if architecture in CHECKED:
        return None, None
    why = (
        f"no test checks the service's answers on {architecture!r} files against a reference, and a mapping that "
        f"reads a file can still serve wrong answers; checked: {', '.join(CHECKED)}"
    )
    if serve_unchecked:
        return None, f"served though {why} (gguf_unchecked=serve): its answers are unchecked"
    return f"refused: {why}. gguf_unchecked=serve serves it anyway, unchecked", None
