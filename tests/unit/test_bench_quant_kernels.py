"""bench/quant_kernels.py: the quantized kernels' table."""

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
    from bench.quant_kernels import heading, markdown_table

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


def test_the_services_int4_kernel_is_a_candidate_where_it_is_not_already_the_default():
    from bench.quant_kernels import candidates

    def w4a16(backend):
        return [c.label for c in candidates(backend, ["w4a16"], False)]

    assert w4a16("zen") == [
        "w4a16 [VLLM_CPU_INT4_W4A8=0]",
        "w4a16 [VLLM_CPU_INT4_W4A8=1]",
        "w4a16 [SERVICE_INT4_KERNEL=auto-round]",
    ]
    assert w4a16("avx512") == ["w4a16", "w4a16 [SERVICE_INT4_KERNEL=auto-round]"]
    assert w4a16("avx2") == ["w4a16"]  # its default already
