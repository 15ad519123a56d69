"""bench/parts/depth.py: which depths a model's context holds, and the depth table from recorded runs."""

from __future__ import annotations

import json

from bench.parts import depth
from bench.servers import SERVED, llama_server
from bench.stats import extract_metrics
from harness import models


def test_depths_past_the_context_are_left_out_with_room_for_the_answer():
    fits, dropped = depth.fitting((128, 4096, 16384, 32768), 32768, 64)
    # 32768 prompt tokens leave no room for an answer in a 32768-token context
    assert fits == (128, 4096, 16384) and dropped == (32768,)
    assert depth.fitting((128, 4096), 8192, 64) == ((128, 4096), ())
    assert depth.fitting((4096,), 4096 + 64 + depth.MARGIN - 1, 64) == ((), (4096,))


def test_the_context_is_the_models_own(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 8192}))
    assert depth.context_of(tmp_path) == 8192
    (tmp_path / "config.json").write_text(json.dumps({"text_config": {"max_position_embeddings": 131072}}))
    assert depth.context_of(tmp_path) == 131072


def test_the_sized_bench_models_reach_agent_depth():
    assert depth.fitting(depth.DepthOptions().at, models.SIZES["1.5b"]["max_position_embeddings"], 64)[0] == (
        128,
        4096,
        16384,
    )
    assert models.SIZES["3b"]["max_position_embeddings"] >= 32768 + 64 + depth.MARGIN


def test_llama_server_gets_the_context_the_deepest_prompt_needs(tmp_path):
    argv = llama_server(tmp_path / "m.gguf", [1], 1, tmp_path / "l.log", ctx_per_slot=16512).argv
    assert argv[argv.index("-c") + 1] == "16512" and argv[argv.index("-np") + 1] == "1"
    assert SERVED in argv


def _run(server, rep, d, ttft_ms, tpot_ms):
    metrics = extract_metrics(
        {
            "duration": 5.0,
            "completed": 2,
            "failed": 0,
            "request_throughput": 0.4,
            "output_throughput": 1000 / tpot_ms,
            "p50_ttft_ms": ttft_ms,
            "p99_ttft_ms": ttft_ms,
            "p50_tpot_ms": tpot_ms,
            "p99_tpot_ms": tpot_ms,
            "p50_itl_ms": tpot_ms,
            "total_output_tokens": 128,
        }
    )
    return {
        "comparison": f"depth-q4_0-gguf-{d}",
        "server": server,
        "concurrency": 1,
        "rep": rep,
        "depth": d,
        "metrics": metrics,
        "client": {"starved": False},
    }


def test_the_table_shows_prefill_and_decode_as_speeds_with_ours_over_llama_cpp():
    runs = []
    for rep, wobble in ((0, 1.0), (1, 1.1)):
        # ours: prefill twice as fast at 4096 tokens (half the TTFT), decode at 0.8 of llama.cpp's (1.25x the TPOT)
        runs += [_run("ours", rep, 4096, 1000 * wobble, 50 * wobble), _run("llama.cpp", rep, 4096, 2000 * wobble, 40)]
    data = {
        "runs": runs,
        "formats": {
            "q4_0-gguf": {
                "gguf": "/c/m.q4_0.gguf",
                "context": 8192,
                "depths": [4096],
                "left_out": [16384],
                "kv_read_per_token": {"4096": 58_720_256},
            }
        },
        "requests": 2,
        "output_len": 64,
        "threads": 1,
        "engine_cpus": [1],
        "repack_off": "llama-server died of SIGILL loading m.q4_0.gguf with its weight repacking on",
    }
    results = {"depth": data}
    [row] = depth.rows(data, depth.comparisons(results))
    # each side's medians over the repetitions: TTFT 1050 and 2100 ms
    assert [round(x) for x in row["prefill"]] == [3901, 1950]
    assert abs(row["prefill_ratio"][0] - 2.0) < 1e-9  # TTFT ratios 1000/2000 and 1100/2200
    assert row["decode_ratio"][0] < 1 and row["decode_ratio"][1] < row["decode_ratio"][0] < row["decode_ratio"][2]
    text = "\n".join(depth.section(results, depth.comparisons(results), []))
    assert "| m.q4_0.gguf (q4_0-gguf) | 4096 | 3901 / 1950 |" in text
    assert "**llama-server died of SIGILL" in text  # a fallback that flatters ours is said in bold
    assert "59 MB" in text and "depths [16384], past its 8192-token context" in text
    assert depth.summary_lines(data, depth.comparisons(results))[0].startswith("depth q4_0-gguf 4096 tokens")


def variant_data() -> dict:
    """A depth run at 16k with two variants of ours beside it: an fp8 KV cache and a 512-token step."""
    runs = []
    for rep in (0, 1):
        runs += [
            _run("ours", rep, 16384, 8000, 100.0 + rep),
            _run("ours-kv-fp8", rep, 16384, 8000, 80.0 + rep),  # decode x1.25 of ours
            _run("ours-chunk-512", rep, 16384, 10000, 100.0 + rep),  # prefill x0.80 of ours
            _run("llama.cpp", rep, 16384, 16000, 200.0),
        ]
    return {
        "runs": runs,
        "formats": {"q4_0-gguf": {"gguf": "/c/m.gguf", "context": 32768, "depths": [16384]}},
        "requests": 2,
        "output_len": 64,
    }


def test_a_variant_served_beside_the_policys_choice_is_compared_with_ours_not_with_llama_cpp():
    data = variant_data()
    compared = depth.comparisons({"depth": data})
    assert {c.name: (c.candidate, c.baseline) for c in compared} == {
        "depth-q4_0-gguf-16384": ("ours", "llama.cpp"),
        "depth-q4_0-gguf-16384/ours-chunk-512": ("ours-chunk-512", "ours"),
        "depth-q4_0-gguf-16384/ours-kv-fp8": ("ours-kv-fp8", "ours"),
    }
    [row] = depth.rows(data, compared)
    assert abs(row["decode_ratio"][0] - 200 / 100.5) < 0.01  # the variants' runs are not ours'
    chunk, kv = depth.variant_rows(data, compared)
    assert (kv["kind"], kv["value"], kv["depth"]) == ("kv", "fp8", 16384) and abs(kv["decode_ratio"][0] - 1.25) < 0.01
    assert (chunk["kind"], chunk["value"]) == ("chunk", "512") and abs(chunk["prefill_ratio"][0] - 0.8) < 0.01
    text = "\n".join(depth.section({"depth": data}, compared, []))
    assert "| q4_0-gguf | 16384 | KV-cache type | fp8 | x1.00" in text
    assert "| q4_0-gguf | 16384 | tokens a step takes | 512 | x0.80" in text


def test_each_variant_sets_its_own_setting_on_ours():
    options = depth.DepthOptions(kv=("fp8",), chunk=(512, 8192), dtype=("bfloat16",))
    assert depth.variants(options) == [
        ("ours-kv-fp8", {"SERVICE_KV_CACHE_DTYPE": "fp8"}),
        ("ours-chunk-512", {"SERVICE_MAX_NUM_BATCHED_TOKENS": "512"}),
        ("ours-chunk-8192", {"SERVICE_MAX_NUM_BATCHED_TOKENS": "8192"}),
        ("ours-dtype-bfloat16", {"SERVICE_DTYPE": "bfloat16"}),
    ]


def test_each_server_gets_a_kv_cache_that_holds_the_deepest_prompt_in_fp32(tmp_path):
    """Not the policy's default (most of the free memory): a KV variant started beside ours found 2.5 GiB free."""
    (tmp_path / "config.json").write_text(json.dumps(models.SIZES["3b"]))
    # 28 layers x 8 KV heads x 128 x (K, V) x 4 bytes = 229 KB a token; 32 832 tokens = 7.0 GiB, a quarter over: 8.8
    assert depth.kv_cache_gib(tmp_path, 32768 + 64) == 9
    (tmp_path / "config.json").write_text(json.dumps(models.SIZES["1.5b"]))
    assert depth.kv_cache_gib(tmp_path, 4096) == 1


def test_a_llama_cpp_built_with_other_flags_is_named_in_the_table(tmp_path, monkeypatch):
    from bench import servers

    monkeypatch.setattr(servers, "LLAMA_CPP_BIN", tmp_path / "bin")
    assert servers.llama_cpp_flags() == ""  # not built: nothing to name
    (tmp_path / "CMakeCache.txt").write_text(
        "GGML_NATIVE:BOOL=ON\nCMAKE_C_FLAGS:STRING=-mno-amx-tile -mno-amx-int8\nCMAKE_CXX_FLAGS:STRING=\n"
    )
    assert servers.llama_cpp_flags() == "-mno-amx-tile -mno-amx-int8"
    data = {"runs": [], "formats": {}, "requests": 1, "output_len": 64, "llama_cpp_flags": servers.llama_cpp_flags()}
    assert "llama.cpp built with `-mno-amx-tile -mno-amx-int8`." in "\n".join(depth.section({"depth": data}, [], []))
