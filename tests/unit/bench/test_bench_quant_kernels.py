"""bench/parts/quant_kernels.py: the quantized kernels' table."""

from __future__ import annotations


def quant_row(fmt, kernel, decode, passes, **kw):
    return {
        "format": fmt,
        "env": kw.get("env", {}),
        "kernel": kernel,
        "decode": {"median": decode, "min": decode - 1, "max": decode + 1},
        "prefill": {"median": 500.0, "min": 450.0, "max": 510.0},
        "kernel_confirmed": kw.get("confirmed", True),
        "quality": {"top1": 0.97 if passes else 0.5, "mean_abs_dlogprob": 0.01 if passes else 0.4},
        "kernel_quality": {"top1": 0.99, "mean_abs_dlogprob": 0.005},
        "quality_passes": passes,
        "bytes_per_token": 505_000_000,
        "ceiling_fraction": 0.8,
    }


def test_quantized_kernel_table_flags_a_corrupted_copy_that_passes_and_an_unconfirmed_kernel():
    from bench.parts.quant_kernels import heading, markdown_table

    report = {
        "machine": "GenuineIntel Xeon (emeraldrapids), backend avx512",
        "date": "2026-11-22 15:00 UTC",
        "reps": 3,
        "load_average": (0.5, 0.4, 0.3),
        "bandwidth": {"gbs": 11.2, "cpus": [1]},
        "rows": [
            quant_row("w8a8", "onednn-w8a8", 21.0, True),
            quant_row("w4a16", "wna16-vec", 6.0, True, confirmed=False, env={"VLLM_CPU_INT4_W4A8": "0"}),
            quant_row("w8a8-corrupt", "onednn-w8a8", 21.0, True),
            {"format": "w8a8-static", "env": {}, "kernel": "onednn-w8a8", "error": "exit 1, log x.log"},
        ],
    }
    table = markdown_table(report).splitlines()
    assert table[2] == (
        "| w8a8 | `onednn-w8a8` | yes | 21.0 [20.0-22.0] | 500 [450-510] | 505 | 80% | 0.97, 0.010 | 0.99, 0.005 | pass |"
    )
    assert table[3].startswith("| w4a16 [VLLM_CPU_INT4_W4A8=0] | `wna16-vec` | NO |")
    assert table[4].endswith("| pass (expected fail) |")  # a corrupted scale that scores as correct is a finding
    assert table[5].startswith("| w8a8-static | onednn-w8a8 | exit 1, log x.log |")
    assert all(line.count("|") == table[0].count("|") for line in table)
    assert "11.2 GB/s on CPU(s) [1]" in heading(report) and "median [min-max] of 3 repetitions" in heading(report)


def test_w4a16_rows_cover_vllms_int4_kernels_and_the_services():
    from bench.parts.quant_kernels import candidates

    def w4a16(backend):
        return [c.label for c in candidates(backend, ["w4a16"], False, True)]

    ours = ["w4a16 [SERVICE_INT4_KERNEL=auto-round]", "w4a16 [SERVICE_INT4_KERNEL=ggml]"]
    assert w4a16("zen") == [
        "w4a16 [SERVICE_INT4_KERNEL=vllm,VLLM_CPU_INT4_W4A8=0]",
        "w4a16 [SERVICE_INT4_KERNEL=vllm,VLLM_CPU_INT4_W4A8=1]",
        *ours,
    ]
    assert w4a16("avx512") == ["w4a16 [SERVICE_INT4_KERNEL=vllm]", *ours]
    assert w4a16("avx2") == ours  # vLLM has no int4 kernel there


def test_bf16_rows_cover_the_calibrations_backend_and_prepack_questions():
    from bench.parts.quant_kernels import candidates

    def bf16(backend, native_bf16=True):
        return [c.label for c in candidates(backend, ["bf16"], False, native_bf16)]

    assert bf16("zen") == ["bf16", "bf16 [SERVICE_BACKEND=avx512]", "bf16 [SERVICE_ZENTORCH_WEIGHT_PREPACK=false]"]
    assert bf16("amx") == bf16("avx512") == ["bf16"]
    # without native bf16: vLLM's bf16 GEMM (converted in software) against the service's kernel
    assert (
        bf16("avx512", False)
        == bf16("avx2", False)
        == ["bf16 [SERVICE_BF16_WEIGHTS=off]", "bf16 [SERVICE_BF16_WEIGHTS=on]"]
    )


def test_a_dense_row_runs_the_platform_its_backend_names():
    from bench.parts.quant_kernels import _dense_plan
    from service.facts.hardware import read_hardware
    from service.facts.software import read_software
    from service.in_vllm.contract import PLATFORM_ENV
    from service.policy.machine.backend import choose_backend
    from service.settings import Settings

    live = choose_backend(read_hardware().cpu, read_software())  # the live CPU's, whatever it is
    kernel, env = _dense_plan(Settings(bf16_weights="off"), "bfloat16")
    assert (kernel, env[PLATFORM_ENV]) == (f"{live.name} GEMM", live.platform)
    for low in live.entry.lowers_to:
        kernel, env = _dense_plan(Settings(backend=low, bf16_weights="off"), "bfloat16")
        assert (kernel, env[PLATFORM_ENV]) == (
            f"{low} GEMM",
            choose_backend(read_hardware().cpu, read_software(), low).platform,
        )


def test_fp32_rows_compare_vllms_fp32_gemm_with_the_services_bf16_weights():
    from bench.parts.quant_kernels import _dense_plan, candidates
    from service.facts.software import read_software
    from service.in_vllm.contract import KERNELS_ENV
    from service.kernels.registry import KERNELS
    from service.settings import Settings

    assert [c.label for c in candidates("zen", ["fp32"], False, True)] == [
        "fp32 [SERVICE_BF16_WEIGHTS=off]",
        "fp32 [SERVICE_BF16_WEIGHTS=on]",
    ]
    kernel, env = _dense_plan(Settings(bf16_weights="off"), "float32")
    assert kernel.endswith(" GEMM") and KERNELS_ENV not in env
    if read_software().ggml_kernel:  # built by make setup; without it the policy keeps fp32 and says why
        kernel, env = _dense_plan(Settings(bf16_weights="on"), "float32")
        assert (kernel, env[KERNELS_ENV]) == ("bf16-weights", KERNELS["bf16-weights"].vllm_class)
