"""Ask Linux for the AMX tile state in this process, as decided at startup (service/policy/in_vllm/amx_state.py)."""

from __future__ import annotations


def request_amx_state(decided: bool) -> str:
    """What became of the request: "granted", "refused" (the kernel or hypervisor said no) or "not asked"."""
    if not decided:
        return "not asked"
    import torch

    # torch's own wrapper of arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA); True once the process may use tiles.
    return "granted" if torch.cpu._init_amx() else "refused"
