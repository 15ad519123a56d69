"""`python -m service detect`: the JSON contract, recorded dumps, exit codes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from service.__main__ import app
from service.facts.cpu import FROM_TABLE, find_part, part_contradicted, read_cpuinfo
from tests.support.live_cpu import expected_backend
from tests.unit.conftest import CPUINFO, MODELS, SYSFS

runner = CliRunner()


def detect(*args: str) -> tuple[int, dict]:
    result = runner.invoke(app, ["detect", "--json", *args])
    return result.exit_code, json.loads(result.stdout)


def test_json_contract_keys():
    code, report = detect("--cpuinfo", str(CPUINFO / "xeon_8480_sapphirerapids.txt"))
    assert code == 0
    hw = report["hardware"]
    assert hw["vendor"] == "GenuineIntel" and hw["microarchitecture"] == "sapphirerapids"
    assert hw["microarchitecture_source"] == "archspec" and (hw["family"], hw["model"], hw["stepping"]) == (6, 143, 8)
    assert set(hw["isa"]) >= {"avx2", "avx512", "avx512_bf16", "amx"} and all(
        isinstance(v, bool) for v in hw["isa"].values()
    )
    assert hw["allowed_cpus"] == list(range(16))
    assert report["backend"]["name"] == "amx" and report["backend"]["reason"]
    assert all(set(d) == {"setting", "value", "reason", "source"} for d in report["decisions"])
    assert report["warnings"] == [] and report["errors"] == []


def test_recorded_container_tree_is_seen_exactly():
    code, report = detect(
        "--cpuinfo", str(SYSFS / "container_cpuset/proc/cpuinfo"), "--sysfs", str(SYSFS / "container_cpuset/sys")
    )
    assert code == 0
    assert report["hardware"]["allowed_cpus"] == [2, 3, 4, 5, 18, 19, 20, 21]
    assert report["hardware"]["memory_limit_bytes"] == 16 * 1024**3
    assert report["threads"] == {"tensor_parallel_size": 1, "ranks": ["2-4"], "reserved": "5"}
    bind = next(d for d in report["decisions"] if d["setting"] == "env.VLLM_CPU_OMP_THREADS_BIND")
    assert bind["value"] == "2-4" and "cpuset" in bind["reason"]


def test_model_decisions_appear_with_model():
    code, report = detect(
        "--cpuinfo",
        str(CPUINFO / "xeon_8480_sapphirerapids.txt"),
        "--model",
        str(MODELS / "qwen3-next-80b-a3b-instruct"),
        "--max-model-len",
        "4096",
    )
    settings = {d["setting"]: d for d in report["decisions"]}
    assert report["model"]["has_linear_attention"] is True
    assert settings["engine.enable_prefix_caching"]["value"] is False
    assert settings["env.VLLM_SSM_CONV_STATE_LAYOUT"]["value"] == "SD"


def test_unsupported_machine_exits_nonzero_with_reason():
    code, report = detect("--cpuinfo", str(CPUINFO / "graviton3_neoverse_v1.txt"))
    assert code == 1 and report["backend"]["name"] is None
    assert "aarch64" in report["errors"][0]


def test_forced_zen_on_intel_exits_nonzero():
    code, report = detect("--cpuinfo", str(CPUINFO / "xeon_8380_icelake.txt"), "--backend", "zen")
    assert code == 1 and "GenuineIntel" in report["errors"][0]


def test_preflight_failure_exits_nonzero():
    code, report = detect(
        "--sysfs", str(SYSFS / "container_cpuset/sys"), "--model", str(MODELS / "llama-3.1-8b-instruct")
    )
    assert code == 1 and "does not fit" in report["errors"][0]


def test_table_output_is_readable():
    result = runner.invoke(app, ["detect", "--cpuinfo", str(CPUINFO / "epyc_9654_zen4.txt")])
    assert result.exit_code == 0 and "Decisions" in result.stdout and "zen4" in result.stdout


def test_avx512_on_one_processor_only_is_not_used_and_the_report_says_so(tmp_path):
    first, second = (CPUINFO / "epyc_zen4_kvm.txt").read_text().strip().split("\n\n")
    dump = tmp_path / "cpuinfo"
    dump.write_text(f"{first}\n\n{second.replace(' avx512f ', ' ')}\n")
    code, report = detect("--cpuinfo", str(dump))
    assert code == 0 and report["hardware"]["flags_not_on_every_cpu"] == ["avx512f"]
    assert report["backend"]["name"] == "avx2"
    table = runner.invoke(app, ["detect", "--cpuinfo", str(dump)], env={"COLUMNS": "200"}).stdout
    assert "avx512_vnni (left out, not on every CPU: avx512f)" in table


@pytest.mark.parametrize("bad", ["--cpuinfo", "--sysfs"])
def test_missing_dump_is_a_clear_error(tmp_path, bad):
    result = runner.invoke(app, ["detect", bad, str(tmp_path / "missing")])
    assert result.exit_code == 2


def test_a_zen5_kvm_guest_is_named_zen5_not_a_generic_level():
    code, report = detect("--cpuinfo", str(CPUINFO / "epyc_zen5_kvm.txt"))
    hw = report["hardware"]
    assert code == 0 and (hw["microarchitecture"], hw["microarchitecture_source"]) == ("zen5", FROM_TABLE)


@pytest.fixture(scope="module")
def live_detect() -> tuple[int, dict]:
    out = subprocess.run(
        [sys.executable, "-m", "service", "detect", "--json"], capture_output=True, text=True, timeout=120
    )
    return out.returncode, json.loads(out.stdout)


def test_live_detect_as_a_real_process_agrees_with_torch(live_detect):
    returncode, report = live_detect
    import torch

    isa = report["hardware"]["isa"]
    assert isa["avx512_bf16"] == torch.cpu._is_avx512_bf16_supported()
    assert isa["amx_tile"] == torch.cpu._is_amx_tile_supported()
    assert report["backend"]["name"] == expected_backend() and returncode == 0


def test_live_detect_names_the_part_its_family_model_says(live_detect):
    # Expectation from this machine's own /proc/cpuinfo identification through the family/model table.
    _, report = live_detect
    cpu = read_cpuinfo()
    hw = report["hardware"]
    assert (hw["vendor"], hw["family"], hw["model"], hw["stepping"]) == (
        cpu.vendor,
        cpu.family,
        cpu.model,
        cpu.stepping,
    )
    part = find_part(cpu.vendor, cpu.family, cpu.model, cpu.stepping)
    if part is not None and not part_contradicted(part, cpu.flags):
        assert hw["microarchitecture"] == part.name, hw
    else:  # a part the table does not know, or a model number its flags contradict: archspec names it
        assert hw["microarchitecture_source"] == "archspec"


def test_pull_checks_the_model_it_fetches_not_the_draft_the_speculative_setting_names(tmp_path, monkeypatch):
    """The draft may be the very model being pulled: a speculative setting that names it must not refuse the pull."""
    monkeypatch.setenv("SERVICE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("SERVICE_SPECULATIVE", str(tmp_path / "not-pulled-yet"))
    result = runner.invoke(app, ["pull", "demo-tiny-llama"])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("ready: demo-tiny-llama -> ")


def test_pull_with_a_table_fetches_every_listed_model_and_names_the_one_refused(tmp_path, monkeypatch):
    """An init container's one `pull` for a model table: each entry checked as its engine will take it."""
    monkeypatch.setenv("SERVICE_CACHE_DIR", str(tmp_path / "cache"))
    table = [{"source": "demo-tiny-llama", "name": "small"}, {"source": "demo-tiny-llama", "name": "other"}]
    monkeypatch.setenv("SERVICE_MODELS", json.dumps(table))
    result = runner.invoke(app, ["pull"])
    assert result.exit_code == 0, result.output
    assert [line.split(" -> ")[0] for line in result.stdout.splitlines()] == ["ready: small", "ready: other"]
    monkeypatch.setenv(
        "SERVICE_MODELS", json.dumps([*table, {"source": "demo-tiny-llama", "name": "huge", "kv_cache_gib": 100000}])
    )
    result = runner.invoke(app, ["pull"])
    assert result.exit_code == 1 and result.stdout.count("ready: ") == 2
    assert "refused: huge: " in result.stderr and "kv_cache_gib=100000" in result.stderr
