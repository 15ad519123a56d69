"""`make docs` and `python -m bench.tools.promote`: the documents' measured tables are what the store renders, a run's rows
reach them, and every link in the docs resolves."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from bench.tools.docs import DOCUMENTS, render, which_to_pick
from bench.tools.promote import depth_rows, peer_rows, write_rows
from service.measurements.store import Row, Store, read_store, store

ROOT = Path(__file__).resolve().parents[3]
DATE = re.compile(r"20[0-9][0-9]-[01][0-9]-")


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: p.name)
def test_the_documents_tables_are_what_the_store_renders(path):
    text = path.read_text()
    assert "<!-- rendered: " in text
    assert render(text, store()) == text, f"{path.name} is stale: run `make docs`"


def test_a_new_row_reaches_the_rendered_table():
    text = "<!-- rendered: which-to-pick (make docs) -->\n<!-- end which-to-pick -->"
    before = render(text, store())
    rows = list(store().rows.values())
    new = [
        Row(
            key=f"peer/zen9/q8_0/c{c}/output",
            cpu="zen9",
            machine="m",
            command="make bench-peer",
            date="2027-01-01",
            value=v,
            unit="x",
            interval=(v - 0.1, v + 0.1),
            params={"format": "q8_0", "concurrency": c, "metric": "output"},
        )
        for c, v in ((1, 0.5), (16, 3.0))
    ]
    after = render(text, Store(rows + new))
    assert "zen9" not in before
    assert "| zen9 | 1 stream: llama.cpp (x0.50); 16: this service (x3.00) |" in after
    # measured at one stream only: its verdict, and the other said to be missing
    only_one = render(text, Store(rows + new[:1]))
    assert "| zen9 | 1 stream: llama.cpp (x0.50); 16: not measured |" in only_one


def peer_run(comparison: str) -> list[dict]:
    return [
        {
            "comparison": comparison,
            "server": server,
            "concurrency": 1,
            "rep": rep,
            "metrics": {"output_throughput": tput, "ttft_p50_ms": 100.0, "ttft_p99_ms": 120.0, "tpot_p50_ms": 10.0},
        }
        for rep in range(3)
        for server, tput in (("ours", 20.0 + rep), ("llama.cpp", 10.0 + rep / 2))
    ]


def peer_results(runs: list[dict]) -> dict:
    return {
        "command": "make bench-peer",
        "started": "2027-01-02T03:04:05",
        "machine": {"cpu": "AMD EPYC", "family_model": "25/17", "microarchitecture": "zen4", "backend": "zen"},
        "peer": {"runs": runs},
    }


def test_promote_writes_a_runs_comparisons_as_rows(tmp_path):
    rows = peer_rows(peer_results(peer_run("peer-q8_0")), "bench/results/x")
    output = next(r for r in rows if r.key == "peer/zen4/q8_0/c1/output")
    assert output.value == pytest.approx(2.0, rel=0.05) and output.date == "2027-01-02 03:04"
    path = tmp_path / "peers.yaml"
    path.write_text("# head\n")
    write_rows(path, rows)
    assert read_store(tmp_path).rows[output.key] == output
    assert path.read_text().startswith("# head\n")


def test_every_relative_link_in_the_docs_resolves():
    pages = [ROOT / "README.md", ROOT / "CHANGELOG.md", *(ROOT / "docs").rglob("*.md")]
    broken = [
        f"{page.relative_to(ROOT)}: {target}"
        for page in pages
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text())
        if not target.startswith(("http:", "https:", "mailto:")) and not (page.parent / target).exists()
    ]
    assert broken == []


def test_the_readme_stays_a_users_page():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    assert not DATE.search(readme.replace("<!--", "")), "a dated figure belongs in the store"


def test_a_users_own_file_stays_in_its_run():
    """`--peer-file`: the store's peer rows are the project's formats, not whatever file a user measured."""
    results = peer_results(peer_run("peer-q8_0") + peer_run("peer-file"))
    assert {r.params["format"] for r in peer_rows(results, "bench/results/x")} == {"q8_0"}


def test_a_size_sweep_run_files_its_rows_beside_the_bench_models():
    """`--peer-size 1.5b`: the same formats on a larger decoder are rows of their own, not the 0.5 B model's."""
    results = peer_results(peer_run("peer-q8_0"))
    results["peer"]["size"] = "1.5b"
    rows = peer_rows(results, "bench/results/x")
    assert {r.key for r in rows} >= {"peer/zen4/1.5b-q8_0/c1/output"} and all("/1.5b-" in r.key for r in rows)
    assert {(r.params["size"], r.params["format"]) for r in rows} == {("1.5b", "1.5b-q8_0")}


def test_a_size_sweep_renders_under_its_own_label_and_stays_out_of_which_to_pick():
    from bench.tools.docs import peer_tables, which_to_pick

    results = peer_results(peer_run("peer-q8_0"))
    results["peer"]["size"] = "3b"
    swept = Store(peer_rows(results, "bench/results/x"))
    tables = "\n".join(peer_tables(swept))
    assert "| 8-bit (W8A8 vs Q8_0), a 3B-shaped random model | 1 | **x2.00**" in tables, tables
    assert all("zen4" not in line for line in which_to_pick(swept)), which_to_pick(swept)

    # and the README's table of sizes names it, with each concurrency's verdict
    from bench.tools.docs import sizes

    assert "| AMD EPYC Zen 4 | 8-bit (W8A8 vs Q8_0), a 3B-shaped random model | 1: this service (x2.00) |" in sizes(
        swept
    )


def speculative_results(size: str | None = None, suffix: bool = False) -> dict:
    """A peer run's speculation as bench/parts/speculative.py's `measure` returns it: two repetitions, one concurrency;
    `suffix`: with suffix decoding and llama.cpp's ngram-mod measured too."""
    keys = ("repeated/c1", "free/c1")
    with_suffix = {
        "suffix/off": dict.fromkeys(keys, [1.1, 1.2]),
        "suffix/llama.cpp-ngram-mod": {"repeated/c1": [1.4, 1.5], "free/c1": [0.9, 1.0]},
        "llama.cpp-ngram-mod/llama.cpp": dict.fromkeys(keys, [1.0, 1.0]),
    }
    ratios = {
        "ngram/off": dict.fromkeys(keys, [1.5, 1.6]),
        "ngram/llama.cpp-lookup": {"repeated/c1": [1.2, 1.3], "free/c1": [0.55, 0.56]},
        "off/llama.cpp": dict.fromkeys(keys, [0.7, 0.75]),
        "llama.cpp-lookup/llama.cpp": dict.fromkeys(keys, [1.0, 1.05]),
    }
    rates = {"ngram": 40.0, "off": 30.0, "llama.cpp-lookup": 33.0, "llama.cpp": 42.0}
    results = peer_results([])
    results["peer"]["size"] = size
    results["peer"]["speculative"] = {
        fmt: {
            "peer_file": f"/cache/{fmt}.gguf",
            "max_tokens": 128,
            "requests_per_start": 3,
            "ratios": ratios,
            "median_tok_s": dict.fromkeys(keys, rates),
            "acceptance": {"repeated": 0.67, "free": 0.2},
        }
        for fmt in ("smollm2-q4_1", "q4_0-gguf", "file")
    }
    if suffix:
        for r in results["peer"]["speculative"].values():
            r["ratios"] |= with_suffix
            r["acceptance_by_method"] = {"ngram": r["acceptance"], "suffix": {"repeated": 0.8, "free": 0.3}}
            r["first_round"] = {
                name: {"repeated/c1": [0.85, 0.95], "free/c1": [0.7, 0.8]} for name in r["ratios"] if "suffix" in name
            }
    return results


def test_promote_files_speculation_as_rows_of_its_own_kind(tmp_path):
    from bench.tools.docs import speculation
    from bench.tools.promote import promote

    run = tmp_path / "run"
    run.mkdir()
    import json

    (run / "results.json").write_text(json.dumps(speculative_results()))
    rows = promote(run, path=tmp_path / "peers.yaml", speculative=tmp_path / "speculative.yaml")
    # a user's own file stays in its run; the others are rows, ours drafting / llama.cpp's lookup
    assert {r.key for r in rows} == {
        f"speculative/zen4/{fmt}/c1/{w}" for fmt in ("smollm2-q4_1", "q4_0-gguf") for w in ("repeated", "free")
    }
    kept = read_store(tmp_path).rows
    repeated = kept["speculative/zen4/q4_0-gguf/c1/repeated"]
    assert repeated.value == pytest.approx(1.249, abs=0.001) and repeated.params["acceptance"] == 0.67
    assert repeated.params["off_vs_llama_cpp"][0] == pytest.approx(0.725, abs=0.001)
    free = kept["speculative/zen4/smollm2-q4_1/c1/free"]
    assert free.interval is not None and free.interval[1] < 1
    table = "\n".join(speculation(Store(kept.values())))
    assert "| AMD EPYC Zen 4 | a Q4_0 file, both sides | repeated | 1 | x1.25 [" in table
    assert "| AMD EPYC Zen 4 | SmolLM2-135M's Q4_1 file, both sides | free | 1 | **x0.56** [" in table


def test_a_size_sweeps_speculation_keeps_the_default_models_file_under_its_own_name():
    from bench.tools.promote import speculative_rows

    keys = {r.key for r in speculative_rows(speculative_results("1.5b"), "bench/results/x")}
    assert "speculative/zen4/1.5b-q4_0-gguf/c1/repeated" in keys
    assert "speculative/zen4/smollm2-q4_1/c1/repeated" in keys


def test_suffix_decoding_rows_keep_their_first_round_apart(tmp_path):
    """With --peer-speculative-suffix: the ngram rows carry suffix decoding's ratios, its acceptance and its first
    round, and the table shows them beside each other (the later rounds had seen answers to the same prompts)."""
    import json

    from bench.parts.peer import speculation_lines, speculation_table
    from bench.tools.docs import suffix_speculation
    from bench.tools.promote import promote

    run = tmp_path / "run"
    run.mkdir()
    results = speculative_results(suffix=True)
    (run / "results.json").write_text(json.dumps(results))
    promote(run, path=tmp_path / "peers.yaml", speculative=tmp_path / "speculative.yaml")
    repeated = read_store(tmp_path).rows["speculative/zen4/q4_0-gguf/c1/repeated"]
    assert repeated.params["acceptance_suffix"] == 0.8
    assert repeated.params["first_round_suffix_vs_llama_cpp_ngram_mod"] == [0.85, 0.95]
    assert repeated.params["suffix_vs_llama_cpp_ngram_mod"][0] == pytest.approx(1.449, abs=0.001)
    table = "\n".join(suffix_speculation(read_store(tmp_path)))
    assert "| AMD EPYC Zen 4 | a Q4_0 file, both sides | repeated | 1 | x1.45 [" in table
    assert "| x0.85-0.95 | 80% |" in table
    # without suffix decoding measured, no such table
    for r in (
        *results["peer"]["speculative"].values(),
        *(plain := speculative_results())["peer"]["speculative"].values(),
    ):
        r["interval"] = {name: {k: [min(v), max(v)] for k, v in by.items()} for name, by in r["ratios"].items()}
        r["estimates"] = {name: {k: f"x{min(v):.2f}" for k, v in by.items()} for name, by in r["ratios"].items()}
    assert "Not measured" in "\n".join(suffix_speculation(Store([]))) and "ngram-mod" not in "\n".join(
        speculation_table(plain["peer"]["speculative"])
    )
    run_table = "\n".join(speculation_table(results["peer"]["speculative"]))
    assert "| /cache/q4_0-gguf.gguf" not in run_table and "q4_0-gguf.gguf (q4_0-gguf) | free | 1 | x0.95" in run_table
    assert any("first round 0.70-0.80" in line for line in speculation_lines(results["peer"]["speculative"]))


def depth_results(repack_off: str = "") -> dict:
    """A depth sweep's run: the SmolLM2 file and the 1.5 B bench model's Q4_0 file at 4096 tokens, two restarts."""
    runs = [
        {
            "comparison": f"depth-{fmt}-4096",
            "server": server,
            "concurrency": 1,
            "rep": rep,
            "depth": 4096,
            "metrics": {
                "output_throughput": 1000 / tpot,
                "ttft_p50_ms": ttft,
                "ttft_p99_ms": ttft,
                "tpot_p50_ms": tpot,
            },
        }
        for fmt in ("smollm2-q4_1", "q4_0-gguf")
        for rep in range(2)
        # ours: TTFT a quarter of llama.cpp's (prefill x4), TPOT twice its (decode x0.5)
        for server, ttft, tpot in (("ours", 1000.0 + rep, 40.0 + rep), ("llama.cpp", 4000.0 + 4 * rep, 20.0 + rep / 2))
    ]
    formats = {
        fmt: {"gguf": f"/c/{fmt}.gguf", "context": 32768, "depths": [4096]} for fmt in ("smollm2-q4_1", "q4_0-gguf")
    }
    results = peer_results([])
    results["depth"] = {"runs": runs, "formats": formats, "size": "1.5b", "output_len": 64, "requests": 2}
    if repack_off:
        results["depth"]["repack_off"] = repack_off
    return results


def test_a_depth_sweep_files_prefill_and_decode_as_speed_ratios(tmp_path):
    from bench.tools.promote import promote

    run = tmp_path / "run"
    run.mkdir()
    (run / "results.json").write_text(json.dumps(depth_results("llama-server died of SIGILL")))
    store_dir = tmp_path / "store"
    store_dir.mkdir()
    rows = promote(
        run, path=store_dir / "peers.yaml", speculative=store_dir / "s.yaml", depth_store=store_dir / "d.yaml"
    )
    by_key = {r.key: r for r in rows}
    # the bench model's file is filed under its size; the default model's file is the same file at any size
    assert set(by_key) == {
        f"depth/zen4/{fmt}/4096/{m}" for fmt in ("smollm2-q4_1", "1.5b-q4_0-gguf") for m in ("prefill", "decode")
    }
    assert by_key["depth/zen4/1.5b-q4_0-gguf/4096/prefill"].value == pytest.approx(4.0, rel=0.01)
    assert by_key["depth/zen4/1.5b-q4_0-gguf/4096/decode"].value == pytest.approx(0.5, rel=0.05)
    assert all(r.says == "llama-server died of SIGILL" for r in rows)  # the peer's handicap travels with the figure
    results = depth_results()
    results["depth"]["llama_cpp_flags"] = "-mno-amx-tile"
    built = depth_rows(results, "bench/results/x")
    assert {r.says for r in built} == {"llama.cpp built with -mno-amx-tile"}
    assert not any("llama_cpp_repacking" in r.params for r in built)
    assert all(r.params["llama_cpp_flags"] == "-mno-amx-tile" for r in built)
    peer = peer_rows(peer_results(peer_run("peer-q8_0")), "bench/results/x")
    [row] = [line for line in which_to_pick(Store(built + peer)) if line.startswith("| AMD EPYC Zen 4 |")]
    assert "llama.cpp (x0.50, llama.cpp built with -mno-amx-tile)" in row
    assert read_store(store_dir).of_kind("depth") == rows


def test_the_depth_rows_render_with_their_notes_and_give_which_to_pick_its_depth_column():
    from bench.tools.docs import depth_table, which_to_pick

    results = depth_results("llama-server died of SIGILL")
    rows = list(store().rows.values())
    peer = peer_rows(peer_results(peer_run("peer-q8_0")), "bench/results/x", cpu="zen9")
    s = Store(rows + peer + depth_rows(results, "bench/results/x", cpu="zen9"))
    table = "\n".join(depth_table(Store(depth_rows(results, "bench/results/x", cpu="zen9"))))
    assert "| zen9 | SmolLM2-135M's Q4_1 file, both sides | 4k | **x4.00** [" in table
    assert "(1) llama-server died of SIGILL." in table and table.count("| (1) |") == 2
    [zen9] = [line for line in which_to_pick(s) if line.startswith("| zen9 |")]
    # a handicapped llama.cpp is said beside the verdict it makes
    assert zen9.endswith(
        "| 4k tokens, SmolLM2-135M's Q4_1 file, both sides: llama.cpp (x0.50, llama.cpp with its repacking off); a "
        "Q4_0 file, both sides, a 1.5B-shaped random model: llama.cpp (x0.50, llama.cpp with its repacking off) |"
    )


def test_a_variants_rows_are_filed_against_the_policys_choice_and_rendered_apart():
    from bench.tools.docs import depth_table, which_to_pick
    from tests.unit.bench.test_bench_depth import variant_data

    results = peer_results([])
    results["depth"] = variant_data() | {"size": "1.5b"}
    rows = {r.key: r for r in depth_rows(results, "bench/results/x", cpu="zen9")}
    chunk = rows["depth/zen9/1.5b-q4_0-gguf/16384/prefill-chunk-512"]
    assert chunk.params["variant"] == "chunk" and chunk.params["chunk"] == "512"
    assert chunk.value == pytest.approx(0.8, rel=0.01) and not chunk.says
    assert rows["depth/zen9/1.5b-q4_0-gguf/16384/decode-kv-fp8"].params["kv"] == "fp8"
    table = "\n".join(depth_table(Store(list(rows.values()))))
    assert (
        "| zen9 | a Q4_0 file, both sides, a 1.5B-shaped random model | 16k | `--depth-chunk 512` | **x0.80**" in table
    )
    # the depth column of which-to-pick is ours against llama.cpp, never a variant against ours
    peer = peer_rows(peer_results(peer_run("peer-q8_0")), "bench/results/x", cpu="zen9")
    [zen9] = [line for line in which_to_pick(Store(list(rows.values()) + peer)) if line.startswith("| zen9 |")]
    assert zen9.endswith("random model: this service (x1.99) |")


def test_two_runs_of_the_same_depth_command_pool_their_repetitions(tmp_path):
    """Each run's restarts numbered apart, the row naming both runs; a run measured otherwise is refused."""
    from bench.tools.promote import pooled_depth, promote

    for name, results in (("a", depth_results()), ("b", depth_results())):
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.json").write_text(json.dumps(results))
    alone = promote(
        tmp_path / "a", path=tmp_path / "p.yaml", speculative=tmp_path / "s.yaml", depth_store=tmp_path / "d.yaml"
    )
    pooled = promote(
        tmp_path / "a",
        path=tmp_path / "p.yaml",
        speculative=tmp_path / "s.yaml",
        depth_store=tmp_path / "d.yaml",
        pool=(tmp_path / "b",),
    )
    assert {r.key for r in pooled} == {r.key for r in alone}
    for before, after in zip(alone, pooled, strict=True):
        assert after.params["repetitions"] == 2 * before.params["repetitions"]
        assert after.run == f"{tmp_path / 'a'} + {tmp_path / 'b'}"
    other = depth_results()
    other["depth"]["output_len"] = 128
    with pytest.raises(SystemExit, match="output_len"):
        pooled_depth(depth_results(), [("b", other)])
