"""StartupReport: the facts, the backend, every decision with its reason, warnings and errors; JSON and table.

The JSON is a contract for scripts and monitoring: keep `hardware.{vendor,microarchitecture,isa,allowed_cpus}`,
`backend.{name,reason}`, `decisions[].{setting,value,reason,source}`, `engine_args` and `env` (what the service
hands to vLLM), `warnings`, `errors`.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.table import Table

from service.facts.cpulist import format_cpulist
from service.facts.hardware import HardwareFacts
from service.facts.model import ModelFacts
from service.facts.software import SoftwareFacts
from service.policy.plan.decision import Decision
from service.policy.plan.plan import EnginePlan


@dataclass(frozen=True)
class StartupReport:
    hardware: HardwareFacts
    software: SoftwareFacts
    model: ModelFacts | None
    plan: EnginePlan

    @property
    def decisions(self) -> tuple[Decision, ...]:
        return self.plan.decisions

    @property
    def warnings(self) -> tuple[str, ...]:
        return self.plan.warnings

    @property
    def errors(self) -> tuple[str, ...]:
        return self.plan.errors

    @property
    def ok(self) -> bool:
        return not self.errors

    def to_dict(self) -> dict[str, Any]:
        return {
            "hardware": _hardware_dict(self.hardware),
            "software": dataclasses.asdict(self.software),
            "model": _model_dict(self.model),
            "backend": {
                "name": self.plan.backend.name,
                "reason": self.plan.backend.reason,
                "requested": self.plan.backend.requested,
                "platform": self.plan.backend.platform,  # the vLLM platform class, enforced by our plugin
            },
            "threads": _threads_dict(self.plan),
            "decisions": [d.as_dict() for d in self.decisions],
            "engine_args": self.plan.engine_args,
            "env": self.plan.env,
            "warnings": list(self.warnings),
            "errors": list(self.errors),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=False)

    def render(self, console: Console) -> None:
        console.print(_summary_table(self))
        console.print(_decision_table(self.decisions))
        for w in self.warnings:
            console.print(f"[yellow]warning:[/yellow] {w}")
        for e in self.errors:
            console.print(f"[bold red]error:[/bold red] {e}")


def _hardware_dict(hw: HardwareFacts) -> dict[str, Any]:
    cpu, topo, lim = hw.cpu, hw.topology, hw.limits
    isa = dataclasses.asdict(cpu.isa) | {"amx": cpu.isa.amx}
    return {
        "source": hw.source,
        "arch": cpu.arch,
        "vendor": cpu.vendor,
        "model_name": cpu.model_name,
        "family": cpu.family,
        "model": cpu.model,
        "stepping": cpu.stepping,
        "microarchitecture": cpu.microarchitecture,
        "microarchitecture_source": cpu.microarchitecture_source,
        "isa": isa,
        "flags_not_on_every_cpu": sorted(cpu.flags_not_on_every_cpu),
        "sockets": topo.sockets,
        "numa_nodes": {str(n): format_cpulist(c) for n, c in sorted(topo.nodes.items())},
        "physical_cores": len(topo.cores),
        "logical_cpus": len(topo.online_cpus),
        "smt": topo.smt,
        "topology_source": topo.source,
        "allowed_cpus": sorted(lim.allowed_cpus),
        "allowed_cpus_list": format_cpulist(lim.allowed_cpus),
        "allowed_cpus_source": lim.allowed_cpus_source,
        "cpu_quota": lim.cpu_quota,
        "memory_limit_bytes": lim.memory_bytes,
        "memory_total_bytes": lim.memory_total_bytes,
        "memory_source": lim.memory_source,
        "memory_available_bytes": lim.memory_available_bytes,
        # What vLLM's worker checks its KV cache against (service/facts/node_memory.py).
        "numa_node_memory": {
            str(n): {"total_bytes": m.total_bytes, "available_bytes": m.available_bytes}
            for n, m in hw.node_memory.items()
        },
    }


def _model_dict(model: ModelFacts | None) -> dict[str, Any] | None:
    return None if model is None else dataclasses.asdict(model) | {"quantization": model.quantization}


def _threads_dict(plan: EnginePlan) -> dict[str, Any] | None:
    t = plan.threads
    if t is None or t.error:
        return None
    return {
        "tensor_parallel_size": t.tp_size,
        "ranks": [format_cpulist(r) for r in t.ranks],
        "reserved": format_cpulist(t.reserved),
    }


def _summary_table(r: StartupReport) -> Table:
    hw = _hardware_dict(r.hardware)
    table = Table(title="Hardware and backend", show_header=False)
    table.add_column("fact", style="bold")
    table.add_column("value")
    isa = ", ".join(k for k, v in hw["isa"].items() if v) or "none"
    if uneven := hw["flags_not_on_every_cpu"]:
        isa += f" (left out, not on every CPU: {', '.join(uneven)})"
    rows = [
        ("source", hw["source"]),
        (
            "CPU",
            f"{hw['vendor']} {hw['model_name']} ({hw['microarchitecture']}, named by "
            f"{hw['microarchitecture_source']}; family/model {hw['family']}/{hw['model']})",
        ),
        ("ISA", isa),
        (
            "topology",
            f"{hw['sockets']} socket(s), NUMA {hw['numa_nodes']}, {hw['physical_cores']} cores, "
            f"{hw['logical_cpus']} CPUs, SMT {'on' if hw['smt'] else 'off'}",
        ),
        ("allowed CPUs", f"{hw['allowed_cpus_list']} ({hw['allowed_cpus_source']})"),
        ("memory", f"{_fmt_bytes(hw['memory_limit_bytes'])} ({hw['memory_source']})"),
    ]
    if r.model is not None:
        rows.append(("model", f"{r.model.architecture} ({r.model.model_type}) at {r.model.path}"))
    name = r.plan.backend.name or "none"
    rows.append(("backend", f"{name}: {r.plan.backend.reason}"))
    rows.append(("vLLM platform", r.plan.backend.platform or "none"))
    for k, v in rows:
        table.add_row(k, str(v))
    return table


def _decision_table(decisions: tuple[Decision, ...]) -> Table:
    table = Table(title="Decisions")
    for col in ("setting", "value", "source", "reason"):
        table.add_column(col)
    for d in decisions:
        table.add_row(d.setting, json.dumps(d.value) if not isinstance(d.value, str) else d.value, d.source, d.reason)
    return table


def _fmt_bytes(n: int | None) -> str:
    return "unknown" if n is None else f"{n / 1024**3:.1f} GiB"
