"""Linear kernels the service hands to vLLM where vLLM has none fast enough (or none at all) on this CPU; the
registry (service/kernels/registry.py KERNELS, those with a provider) names them; the policy decides where each runs."""

from __future__ import annotations

import importlib

from service.kernels.registry import KERNELS


def register_kernels(names: str) -> dict[str, str]:
    """Hand the service's kernels named in `names` (comma-separated vLLM class names) to vLLM; per name, "registered"
    or why not."""
    providers = {k.vllm_class: k.provider for k in KERNELS.values() if k.provider}
    status = {}
    for name in filter(None, names.split(",")):
        if name not in providers:
            status[name] = f"not a kernel of the service (it has {', '.join(sorted(providers))})"
            continue
        try:
            importlib.import_module(providers[name]).register()
            status[name] = "registered"
        except (ImportError, OSError) as exc:
            status[name] = f"not registered: {exc}"
    return status
