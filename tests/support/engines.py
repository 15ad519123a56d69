"""Every engine the test suite starts: how many times a session may start it, and why no engine already running serves
its tests. An engine start costs a minute or more on a slow CPU (a Zen 1 took 50-75 s for the demo model), so the
suite's time is mostly its count.

`started(name)` counts one start. `tests/support/server.start_service` calls it for every service process, and the
container tests call it for every container that runs the service. A name is `family` or `family/variant`, the
family a key of ENGINES. A family that is not registered, or one started more often than registered, fails the test
that started it, so that no engine is added to the suite unseen. At the end the session prints the counts
(tests/support/phases.py), and tests/unit/project/test_engine_registry.py checks every start in the test sources against
this table."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass


@dataclass(frozen=True)
class Engine:
    starts: int  # at most, per session, on whichever CPU the suite runs on
    why: str  # why its tests cannot use an engine that is running anyway


# The quality paths of SmolLM2 a CPU can offer (tests/integration/test_real_model_quality.py): two backends x two
# dtypes, the fp8 KV cache, W8A8 and W4A16, each on up to two more kernels.
QUALITY_PATHS = 11

ENGINES: dict[str, Engine] = {
    # Shared by the integration suite (package scope).
    "chat": Engine(1, "the demo model with an API key: the OpenAI API, agents, metrics and platform tests share it"),
    "default": Engine(1, "the default model (SmolLM2) as `make serve` runs it: real answers, and one quality path"),
    "gdn": Engine(1, "a Gated-DeltaNet model: its own architecture"),
    "embed": Engine(1, "a pooling model (MiniLM): embeddings, not generation"),
    # One test file's own model or settings.
    "qwen3-chat": Engine(1, "a Qwen3-style chat model: its tool and reasoning parsers"),
    "agent-clients": Engine(
        1,
        "Claude Code and Codex CLI need a template that renders their tools and 30k tokens of context for their "
        "prompts (in the tiny models' vocabulary); the Qwen3-style chat model has 2k, SmolLM2 renders no tools",
    ),
    "model-table": Engine(
        7,
        "several models in one service, each load an engine of its own: the table with chat pinned, then embed, demo, "
        "demo after its engine is killed, and a table refused before any engine; Claude Code's two models (the main "
        "one pinned, then the small fast one)",
    ),
    "chat-template": Engine(1, "a model served with a chat template file the user gives"),
    "gguf-file": Engine(1, "a GGUF file dequantized (gguf_blocks=off)"),
    "gguf-blocks": Engine(1, "a GGUF file's own blocks on ggml's kernel"),
    "hub": Engine(1, "a hub id downloaded on first start from a loopback hub, then served"),
    "gguf-llama3-rope": Engine(1, "a Llama 3.x file from llama.cpp's converter, its answers against llama.cpp's"),
    "gguf-arch-blocks": Engine(
        5,
        "Gemma 2's, Gemma 3's, Phi-3's, Qwen2-MoE's and Qwen3-MoE's Q8_0 blocks, other models in vLLM, against llama.cpp",
    ),
    "gguf-check": Engine(1, "the default model's converted copy with its rope base lost: refused before ready"),
    "speculative": Engine(
        2, "SmolLM2 with n-gram drafting, and with suffix decoding: the proposer is built into the engine at its start"
    ),
    "lora": Engine(1, "LoRA adapters: an engine built with LoRA slots"),
    "bf16-weights": Engine(1, "the service's bf16-weight kernel on an fp32 engine"),
    "ab-avx512": Engine(1, "vLLM's generic platform on a Zen host (started only there)"),
    "forced-patch": Engine(1, "vLLM's offline engine in a script of its own, with the startup patch forced on"),
    "quantized": Engine(3, "one per quantized demo checkpoint: W8A8, W4A16, W4A16 on auto-round's kernel"),
    "quality": Engine(QUALITY_PATHS, "one per path SmolLM2 is served on (backend, dtype, KV cache, kernel)"),
    "calibrated": Engine(2, "a start that reads a calibration stored by `detect --calibrate`, per model"),
    "tensor-parallel": Engine(2, "two ranks on simulated NUMA nodes; the second one's worker is killed"),
    # The reliability suite: small capacity on a shared engine, and engines its tests kill or stop.
    "reliability": Engine(1, "the shared small-capacity server: bad input, overload, security"),
    "disconnects": Engine(1, "client disconnects under load, measured from a quiet engine"),
    "engine-death": Engine(
        6, "each kills or stops its engine: a dead core, one draining, a hung core, the server, two while starting"
    ),
    "shared-cache": Engine(2, "two replicas in two pid namespaces on one fresh cache, one conversion stopped mid-way"),
    "graceful-shutdown": Engine(3, "each is stopped by SIGTERM: draining, past the grace, and while it starts"),
    # Containers (tests/container): each runs an image.
    "compose": Engine(1, "the compose stack: the default image and Prometheus"),
    "image": Engine(4, "the generic, AMX and Zen images, and the Zen image forced to zen (refuses off AMD)"),
    # Only under `pytest -m compile_cache`: cold then warm, natively and in the default image.
    "compile-cache": Engine(4, "torch.compile from scratch, then from its cache: two starts each, native and image"),
}

_STARTED: Counter[str] = Counter()


class UnregisteredEngine(AssertionError):
    pass


def family(name: str) -> str:
    return name.split("/", 1)[0]


def started(name: str) -> None:
    """Count a start of engine `name`; fail when its family is not registered or has used up its starts."""
    key = family(name)
    if key not in ENGINES:
        raise UnregisteredEngine(
            f"engine {name!r} is not in tests/support/engines.py: use an engine that runs anyway, or register it "
            "with why none does"
        )
    _STARTED[key] += 1
    if _STARTED[key] > ENGINES[key].starts:
        raise UnregisteredEngine(
            f"engine {key!r} started {_STARTED[key]} times, registered for {ENGINES[key].starts}: a fixture meant to "
            "share it starts it again"
        )


def counts() -> Counter[str]:
    return Counter(_STARTED)
