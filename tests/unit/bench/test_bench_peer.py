"""The llama.cpp peer's server arguments and weight-byte counts (the build and the runs themselves: `make bench-peer`)."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from bench import servers
from bench.parts import peer


def test_llama_server_gets_the_engine_cores_and_one_slot_per_concurrent_request(tmp_path):
    server = servers.llama_server(tmp_path / "m.gguf", [2, 3], 16, tmp_path / "log")
    argv = server.argv
    opt = dict(zip(argv, argv[1:]))
    assert argv[0].endswith("llama-server") and opt["-m"] == str(tmp_path / "m.gguf")
    assert opt["-t"] == "2" and opt["-tb"] == "2"
    assert opt["-C"] == "0xc" and opt["-Cb"] == "0xc" and opt["--cpu-strict"] == "1"
    assert opt["-np"] == "16" and opt["-c"] == str(16 * servers.CTX_PER_SLOT)
    assert opt["--port"] == "{port}" and opt["-a"] == servers.SERVED and server.ready_path == "/health"


def test_llama_server_sends_no_sse_ping_that_vllms_benchmark_client_would_misread(tmp_path):
    """vLLM's client strips each read before buffering it: a lone ":" ping loses its blank line, and every later
    event is read as part of that comment, so a request pinged before its first token counts as failed."""
    from vllm.benchmarks.lib.endpoint_request_func import StreamedResponseHandler

    event = b'data: {"choices": [{"text": "a"}]}\n\n'
    for reads, parsed in (([event], 1), ([b":\n\n", event, event], 0)):
        handler = StreamedResponseHandler()
        assert len([m for read in reads for m in handler.add_chunk(read.strip())]) == parsed
    argv = servers.llama_server(tmp_path / "m.gguf", [0], 16, tmp_path / "log").argv
    opt = dict(zip(argv, argv[1:]))
    assert opt["--sse-ping-interval"] == "-1"


def test_ours_bytes_per_token_are_the_services_own_decision():
    from bench.servers import Reported

    decided = {"setting": "model.read_per_token", "value": 2_000_000_000, "reason": "in float32", "source": "policy"}
    assert Reported({"decisions": [decided]}).read_per_token == 2_000_000_000
    assert Reported({"decisions": []}).read_per_token is None


def test_the_peer_section_says_which_kernel_ours_ran_and_what_chose_it():
    """A calibration may choose another kernel than the table's (on AMX it once left W4A8 out): the table says."""
    from bench.servers import Reported

    calibrated = {"setting": "quant.linear_kernel", "value": "amx-w4a8", "source": "calibration", "reason": ""}
    bf16 = {"setting": "engine.dtype", "value": "bfloat16", "source": "policy", "reason": ""}
    backend = {"name": "amx"}
    assert Reported({"decisions": [calibrated, bf16], "backend": backend}).linear_kernel == "amx-w4a8 (calibration)"
    assert Reported({"decisions": [bf16], "backend": backend}).linear_kernel == "the amx backend's bfloat16 GEMM"
    blocks = {"setting": "model.gguf_blocks", "value": "Q4_1", "source": "policy", "reason": ""}
    assert Reported({"decisions": [blocks, bf16], "backend": backend}).linear_kernel == (
        "the GGUF file's own Q4_1 blocks on the service's ggml kernel (policy)"
    )
    kept = {"setting": "engine.linear_weights", "value": "bf16", "source": "policy", "reason": ""}
    fp32 = {**bf16, "value": "float32"}
    assert Reported({"decisions": [kept, fp32], "backend": {"name": "avx2"}}).linear_kernel == (
        "bf16 weights on the service's kernel in a float32 engine (policy)"
    )
    dequantized = {**blocks, "value": "dequantized"}
    assert Reported({"decisions": [dequantized, bf16], "backend": backend}).linear_kernel == (
        "the amx backend's bfloat16 GEMM"
    )
    results = {
        "peer": {"runs": [], "formats": {"q4_0": {"kernel": "amx-w4a8 (calibration)"}, "old": {}}},
        "options": {},
    }
    assert "Our linear layers ran: q4_0: amx-w4a8 (calibration)." in peer.section(results, [], [])


def test_each_format_pairs_a_service_model_with_a_gguf_type():
    assert peer.FORMATS["bf16"] == (None, "BF16")
    assert peer.FORMATS["q8_0"] == ("w8a8", "Q8_0") and peer.FORMATS["q4_0"] == ("w4a16", "Q4_0")
    # The -gguf formats serve llama.cpp's own file on both sides.
    assert peer.FORMATS["q4_0-gguf"] == (peer.GGUF, "Q4_0") and peer.FORMATS["q8_0-gguf"] == (peer.GGUF, "Q8_0")
    assert peer.FORMATS["q4_k_m-gguf"] == (peer.GGUF, "Q4_K_M")  # llama-quantize's mix, not --pure
    assert peer.FORMATS["q4_1-gguf"] == (peer.GGUF, "Q4_1")
    base, gguf = Path("/m/bench"), Path("/m/bench.q4_0.gguf")
    assert peer.sides("q4_0-gguf", base, {"q4_0-gguf": gguf}) == peer.Sides(gguf, gguf, base, {})
    assert peer.sides("bf16", base, {"bf16": gguf}) == peer.Sides(base, gguf, base, {})
    # The default model's own file on both sides, its blocks kept by the service.
    assert peer.FORMATS["smollm2-q4_1"] == (peer.DEFAULT_GGUF, "Q4_1")
    why = peer.available()
    assert why is None or "make bench-tools" in why


def test_the_peer_section_names_where_our_batch_1_step_goes_in_milliseconds():
    from types import SimpleNamespace

    profiled = {"samples": 800, "by_area": [("linear layers (ggml: the service's kernels)", 0.4)]}
    results = {"runs": [], "formats": {"smollm2-q4_1": {"profile": profiled}, "q8_0": {}}}
    ours_c1 = SimpleNamespace(name="peer-smollm2-q4_1", concurrency=1, candidate_metrics={"tpot_p50_ms": 18.0})
    lines = [line for line in peer.profile_lines(results, []) if line]
    assert lines == [
        "Where our batch-1 decode step goes on smollm2-q4_1 (py-spy --native on the engine process, one extra run, "
        "800 samples; ms at the c=1 TPOT p50): linear layers (ggml: the service's kernels) 40%."
    ]
    with_tpot = peer.profile_lines(results, [ours_c1])
    assert with_tpot[0].endswith("linear layers (ggml: the service's kernels) 40% (7.2 ms).")


def test_llama_cpp_reads_the_token_table_whole_only_where_it_is_the_output_head():
    from gguf import GGUFReader

    from tests.support.gguf_models import tiny_gguf
    from tests.support.server import MODELS

    for arch, tied in (("llama", True), ("qwen3", False)):
        path = tiny_gguf(MODELS, arch, "Q8_0")
        sizes = {t.name: int(t.n_bytes) for t in GGUFReader(str(path)).tensors}
        assert ("output.weight" not in sizes) == tied
        table = 0 if not tied else sizes["token_embd.weight"]
        assert peer.gguf_bytes_per_token(path) == sum(sizes.values()) - sizes["token_embd.weight"] + table


FAKE_LLAMA_SERVER = """#!{python}
import http.server, os, signal, sys
if os.environ.get("LLAMA_ARG_REPACK") != "0":  # as llama.cpp's AMX kernel did on guests, while loading
    os.kill(os.getpid(), signal.{signal})
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b'{{"status": "ok"}}')
http.server.HTTPServer(("127.0.0.1", int(sys.argv[sys.argv.index("--port") + 1])), Health).serve_forever()
"""


@pytest.mark.parametrize("crash", ["SIGILL", "SIGSEGV"])
def test_a_llama_server_that_crashes_while_loading_runs_with_repacking_off_and_the_table_says_so(
    tmp_path, monkeypatch, crash
):
    import sys
    from types import SimpleNamespace

    fake = tmp_path / "bin" / "llama-server"
    fake.parent.mkdir()
    fake.write_text(FAKE_LLAMA_SERVER.format(python=sys.executable, signal=crash))
    fake.chmod(0o755)
    monkeypatch.setattr(servers, "LLAMA_CPP_BIN", fake.parent)
    monkeypatch.delenv("LLAMA_ARG_REPACK", raising=False)
    ctx, state = SimpleNamespace(startup_s={}), {}
    started = [peer.start_llama(ctx, state, tmp_path / "m.gguf", [0], c, tmp_path / f"c{c}.log") for c in (1, 4)]
    for server in started:
        assert server.env["LLAMA_ARG_REPACK"] == "0" and server.proc.poll() is None
        server.close()
    assert crash in state["repack_off"] and "m.gguf" in state["repack_off"]
    assert len(ctx.startup_s["llama.cpp"]) == 2  # the second started with repacking off at once
    results = {"peer": {"repack_off": state["repack_off"], "runs": []}, "options": {}}
    assert "LLAMA_ARG_REPACK=0" in "\n".join(peer.section(results, [], []))
    # A user's own setting is left as it is: the crash is the bench's error then.
    monkeypatch.setenv("LLAMA_ARG_REPACK", "1")
    with pytest.raises(RuntimeError, match=f"exited with -{int(getattr(signal, crash))}"):
        peer.start_llama(ctx, {}, tmp_path / "m.gguf", [0], 1, tmp_path / "user.log")


def test_the_decode_profile_runs_a_decode_bound_load():
    """Its shares are read as shares of a decode step: the prefill of one short prompt must be a small part of it."""
    from bench.load import Workload

    measured = Workload(1, 2, 128, 32, seed=1)
    profiled = peer.profiled_workload(measured)
    assert profiled.concurrency == 1 and profiled.seed == measured.seed
    assert profiled.output_len >= 8 * measured.output_len and profiled.input_len * 8 <= measured.input_len


def test_speculation_runs_only_on_files_both_servers_load():
    """`--peer-speculative q8_0`: the service's W8A8 copy is not llama.cpp's file, so drafting would be compared on
    different weights."""
    from bench.parts.peer import PeerOptions, speculation

    with pytest.raises(SystemExit, match="q8_0: a GGUF file both servers load"):
        speculation(None, PeerOptions(speculative=("q4_0-gguf", "q8_0")), Path("/nonexistent"))  # type: ignore[arg-type]
