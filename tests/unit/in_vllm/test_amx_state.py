"""The AMX tile-state decision (service/policy/in_vllm/amx_state.py), from recorded CPUs, and the request on this one."""

from __future__ import annotations

import json

import pytest
import torch

from service.facts.cpu import read_cpuinfo
from service.in_vllm import plugin as vllm_plugin
from service.in_vllm.amx_request import request_amx_state
from service.in_vllm.contract import AMX_STATE_ENV, FXGRAPH_PATCH_ENV, KERNELS_ENV, PLATFORM_ENV
from service.policy.in_vllm.amx_state import amx_state
from service.settings import Settings
from service.startup import build_report
from tests.unit.conftest import CPUINFO

RECORDED = sorted(CPUINFO.glob("*.txt"))


@pytest.mark.parametrize("path", RECORDED, ids=[p.stem for p in RECORDED])
def test_asked_exactly_where_the_cpu_shows_amx_tiles(path):
    cpu = read_cpuinfo(path)
    decided = {d.name: d.value for d in amx_state(cpu.isa).decisions}
    assert decided == ({AMX_STATE_ENV: "1"} if "amx_tile" in cpu.flags else {})
    if "amx_tile" in cpu.flags:  # and the startup report carries it to vLLM's processes
        report = build_report(Settings(), model=None, cpuinfo=path, environ={})
        assert report.to_dict()["env"][AMX_STATE_ENV] == "1"
        assert "SIGILL" in report.plan.find(f"env.{AMX_STATE_ENV}").reason


def test_this_process_gets_the_tile_state_where_torch_sees_tiles():
    assert request_amx_state(False) == "not asked"
    assert request_amx_state(True) == ("granted" if torch.cpu._is_amx_tile_supported() else "refused")


def test_every_process_reports_the_request_and_a_refusal_is_an_error(monkeypatch, caplog):
    for name in (PLATFORM_ENV, FXGRAPH_PATCH_ENV, KERNELS_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(AMX_STATE_ENV, "1")
    vllm_plugin.every_process()
    (record,) = [r for r in caplog.records if r.getMessage().startswith(vllm_plugin.STATE_PREFIX)]
    state = json.loads(record.getMessage().removeprefix(vllm_plugin.STATE_PREFIX))
    granted = torch.cpu._is_amx_tile_supported()
    assert state["amx_tile_state"] == ("granted" if granted else "refused")
    assert (record.levelname == "ERROR") == (not granted)
