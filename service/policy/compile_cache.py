"""Where vLLM keeps its torch.compile cache, and whether its 0.32 loader needs our fix to reuse it.

vLLM stores compiled graphs under VLLM_CACHE_ROOT (default ~/.cache/vllm). The service keeps them under its
own cache_dir, next to the demo model, so one directory (the container's cache volume) holds everything a
warm restart needs.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from service import compile_cache_patch
from service.policy.decision import Decision

ROOT_VAR = "VLLM_CACHE_ROOT"


@dataclass(frozen=True)
class CompileCachePlan:
    decisions: tuple[Decision, ...]
    env: dict[str, str] = field(default_factory=dict)


def plan_compile_cache(cache_dir: Path, vllm_version: str | None, environ: Mapping[str, str]) -> CompileCachePlan:
    env: dict[str, str] = {}
    if environ.get(ROOT_VAR):
        root = Decision(f"env.{ROOT_VAR}", environ[ROOT_VAR], "set in the environment by the user", "user")
    else:
        env[ROOT_VAR] = str(cache_dir / "vllm")
        root = Decision(
            f"env.{ROOT_VAR}",
            env[ROOT_VAR],
            "torch.compile artifacts under the service's cache_dir (the container's cache volume), reused by "
            "the next start with the same model and settings",
            "policy",
        )
    needed = compile_cache_patch.needs_patch(vllm_version)
    patch = Decision(compile_cache_patch.SETTING, needed, compile_cache_patch.reason(vllm_version), "policy")
    return CompileCachePlan((root, patch), env)
