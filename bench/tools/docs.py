"""`make docs`: the documents' measured tables, rendered from the measurement store (service/measurements/).

Each rendered block sits between `<!-- rendered: NAME (make docs) -->` and `<!-- end NAME -->` in README.md or docs/;
`python -m bench.tools.docs` rewrites the blocks, `--check` exits 1 naming the files whose blocks differ from the store."""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from pathlib import Path

from service.measurements.store import Row, Store, store

REPO = Path(__file__).resolve().parents[2]
DOCUMENTS = (REPO / "README.md", REPO / "docs" / "benchmarks.md")

CPUS = {
    "zen5": "AMD EPYC Zen 5",
    "zen4": "AMD EPYC Zen 4",
    "zen3": "AMD EPYC Zen 3 (AVX2 only)",
    "zen2": "AMD EPYC Zen 2 (AVX2 only)",
    "zen1": "AMD EPYC Zen 1 (AVX2 in 128-bit halves)",
    "emeraldrapids-nobf16": "Intel Xeon, AVX-512 without BF16 or AMX",
    "xeon-amx": "Intel Xeon with AMX",
}
FORMATS = {
    "q8_0": "8-bit (W8A8 vs Q8_0)",
    "q4_0": "4-bit (W4A16 vs Q4_0)",
    "bf16": "bf16",
    "q4_k_m-gguf": "a Q4_K_M file, both sides",
    "q4_0-gguf": "a Q4_0 file, both sides",
    "q4_1-gguf": "a Q4_1 file, both sides",
    "q8_0-gguf": "a Q8_0 file, both sides",
    "smollm2-q4_1": "SmolLM2-135M's Q4_1 file, both sides",
}
PICK_FORMATS = ("q8_0", "q4_0", "bf16", "q4_k_m-gguf", "smollm2-q4_1")


def _label(table: dict[str, str], key: str) -> str:
    """A size sweep's format ("1.5b-q4_0-gguf") is its format's label at that decoder size."""
    size, _, fmt = key.partition("-")
    if table is FORMATS and key not in table and fmt in table and size.endswith("b"):
        return f"{table[fmt]}, a {size.upper()}-shaped random model"
    return table.get(key, key)


def _ordered(keys: list[str], table: dict[str, str]) -> list[str]:
    known = [k for k in table if k in keys]
    return known + sorted(k for k in keys if k not in table)


def _ratio(r: Row) -> str:
    if r.interval is None:
        return f"x{r.value:.2f}"
    bold = r.interval[0] > 1 or r.interval[1] < 1
    figure = f"x{r.value:.2f}"
    return f"{'**' + figure + '**' if bold else figure} [{r.interval[0]:.2f}, {r.interval[1]:.2f}]"


def _verdict(r: Row) -> str:
    """Output throughput ours / llama.cpp: whose side the whole interval is on."""
    low, high = r.interval or (r.value, r.value)
    assert low is not None and high is not None
    return "this service" if low > 1 else "llama.cpp" if high < 1 else "either"


def _peer(s: Store, cpu: str, fmt: str, c: int, metric: str) -> Row | None:
    return s.rows.get(f"peer/{cpu}/{fmt}/c{c}/{metric}")


def _k(tokens: int) -> str:
    return f"{tokens // 1024}k" if tokens >= 1024 else str(tokens)


def _at_depth(s: Store, cpu: str) -> str:
    """Decode at the deepest prompt the depth sweep measured on this CPU class, per file: whose speed it favours."""
    rows = [
        r for r in s.of_kind("depth") if r.cpu == cpu and r.params["metric"] == "decode" and "against" not in r.params
    ]
    if not rows:
        return "not measured"
    deepest = max(r.params["depth"] for r in rows)
    verdicts = [
        f"{_label(FORMATS, r.params['format'])}: {_verdict(r)} (x{r.value:.2f}"
        + (", llama.cpp with its repacking off" if r.params.get("llama_cpp_repacking") == "off" else "")
        + (f", llama.cpp built with {r.params['llama_cpp_flags']}" if r.params.get("llama_cpp_flags") else "")
        + ")"
        for r in rows
        if r.params["depth"] == deepest
    ]
    return f"{_k(deepest)} tokens, " + "; ".join(verdicts)


def which_to_pick(s: Store) -> list[str]:
    """One row per CPU class, one column per format: whose output throughput the interval favours, at one stream
    and at 16; and a column for decode at agent depth (the depth sweep's deepest prompt)."""
    peers = s.of_kind("peer")
    cpus = _ordered(sorted({r.cpu for r in peers if r.params["format"] in PICK_FORMATS}), CPUS)
    lines = [
        "| CPU | " + " | ".join(FORMATS[f] for f in PICK_FORMATS) + " | decode at agent depth, one stream |",
        "| --- |" + " --- |" * (len(PICK_FORMATS) + 1),
    ]
    for cpu in cpus:
        cells = []
        for fmt in PICK_FORMATS:
            one, many = _peer(s, cpu, fmt, 1, "output"), _peer(s, cpu, fmt, 16, "output")
            if one is None:
                cells.append("not measured")
                continue
            if many is None:
                cells.append(f"1 stream: {_verdict(one)} (x{one.value:.2f}); 16: not measured")
                continue
            a, b = _verdict(one), _verdict(many)
            cells.append(
                f"{a} (x{one.value:.2f})"
                if a == b
                else f"1 stream: {a} (x{one.value:.2f}); 16: {b} (x{many.value:.2f})"
            )
        cells.append(_at_depth(s, cpu))
        lines.append(f"| {_label(CPUS, cpu)} | " + " | ".join(cells) + " |")
    return lines


def depth_table(s: Store) -> list[str]:
    """The depth sweep: per CPU class, file and depth, prefill and decode speed ours / llama.cpp; what a row's run
    says of itself (a llama.cpp that ran with its repacking off) as a numbered note."""
    rows = [r for r in s.of_kind("depth") if "against" not in r.params]
    lines = [
        "| CPU | file | depth | prefill, ours / llama.cpp | decode, ours / llama.cpp | note |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    notes: list[str] = []
    for cpu in _ordered(sorted({r.cpu for r in rows}), CPUS):
        for fmt in sorted({r.params["format"] for r in rows if r.cpu == cpu}):
            for depth in sorted({r.params["depth"] for r in rows if r.cpu == cpu and r.params["format"] == fmt}):
                prefill, decode = (s.rows.get(f"depth/{cpu}/{fmt}/{depth}/{m}") for m in ("prefill", "decode"))
                says = next((r.says for r in (prefill, decode) if r is not None and r.says), "")
                if says and says not in notes:
                    notes.append(says)
                cells = [_ratio(r) if r else "" for r in (prefill, decode)]
                note = f"({notes.index(says) + 1})" if says else ""
                lines.append(
                    f"| {_label(CPUS, cpu)} | {_label(FORMATS, fmt)} | {_k(depth)} | {' | '.join(cells)} | {note} |"
                )
    lines += ["", *(f"({n}) {says}." for n, says in enumerate(notes, 1))] if notes else []
    return lines + variant_table(s)


def variant_table(s: Store) -> list[str]:
    """`--depth-kv`, `--depth-chunk`, `--depth-dtype`: another setting served beside the policy's choice, as speeds against it."""
    rows = [r for r in s.of_kind("depth") if "against" in r.params]
    if not rows:
        return []
    lines = [
        "",
        "Another setting against the policy's choice, in the same service (`--depth-kv`, `--depth-chunk`, `--depth-dtype`):",
        "",
        "| CPU | file | depth | setting | prefill | decode |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for cpu in _ordered(sorted({r.cpu for r in rows}), CPUS):
        varied = {
            (r.params["format"], r.params["depth"], r.params["variant"], str(r.params[r.params["variant"]]))
            for r in rows
            if r.cpu == cpu
        }
        for fmt, depth, kind, value in sorted(varied):
            cells = [s.rows.get(f"depth/{cpu}/{fmt}/{depth}/{m}-{kind}-{value}") for m in ("prefill", "decode")]
            lines.append(
                f"| {_label(CPUS, cpu)} | {_label(FORMATS, fmt)} | {_k(depth)} | `--depth-{kind} {value}` | "
                + " | ".join(_ratio(r) if r else "" for r in cells)
                + " |"
            )
    return lines


def sizes(s: Store) -> list[str]:
    """The size sweep's formats (random models at common checkpoints' decoder shapes): per CPU class and size, whose
    output throughput the interval favours at each concurrency measured."""
    swept = [r for r in s.of_kind("peer") if "size" in r.params and r.params["metric"] == "output"]
    lines = ["| CPU | weights | streams: whose output throughput (ours / llama.cpp) |", "| --- | --- | --- |"]
    for cpu in _ordered(sorted({r.cpu for r in swept}), CPUS):
        for fmt in sorted({r.params["format"] for r in swept if r.cpu == cpu}):
            cells = [
                f"{r.params['concurrency']}: {_verdict(r)} (x{r.value:.2f})"
                for r in sorted(swept, key=lambda r: r.params["concurrency"])
                if r.cpu == cpu and r.params["format"] == fmt
            ]
            lines.append(f"| {_label(CPUS, cpu)} | {_label(FORMATS, fmt)} | " + "; ".join(cells) + " |")
    return lines


def speculation(s: Store) -> list[str]:
    """Speculative decoding, each side with its own drafting: ours with n-gram drafting / llama.cpp's server with its
    prompt lookup, per CPU class, file, text and concurrency, with the share of drafts ours accepted."""
    rows = s.of_kind("speculative")
    lines = [
        "| CPU | file | text | streams | ours drafting / llama.cpp's lookup | drafts accepted |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for cpu in _ordered(sorted({r.cpu for r in rows}), CPUS):
        mine = [r for r in rows if r.cpu == cpu]
        for r in sorted(
            mine, key=lambda r: (r.params["format"], r.params["workload"] != "repeated", r.params["concurrency"])
        ):
            lines.append(
                f"| {_label(CPUS, cpu)} | {_label(FORMATS, r.params['format'])} | {r.params['workload']} | "
                f"{r.params['concurrency']} | {_ratio(r)} | {r.params['acceptance']:.0%} |"
            )
    return lines


def table_cpus(s: Store) -> list[str]:
    """A model table's two engines on split CPUs / shared ones (bench/tools/table_cpus.py), per CPU class and file."""
    rows = s.of_kind("table-cpus")
    lines = [
        "| CPU | file | two engines decoding at once, split / shared | one alone, split / shared | run |",
        "| --- | --- | --- | --- | --- |",
    ]
    for cpu in _ordered(sorted({r.cpu for r in rows}), CPUS):
        for fmt in sorted({r.params["format"] for r in rows if r.cpu == cpu}):
            together, alone = (s.rows.get(f"table-cpus/{cpu}/{fmt}/{what}") for what in ("together", "alone"))
            first = together or alone
            assert first is not None
            lines.append(
                f"| {_label(CPUS, cpu)} | {_label(FORMATS, fmt)} | {_ratio(together) if together else 'n/a'} | "
                f"{_ratio(alone) if alone else 'n/a'} | `{first.command}`, {first.date} |"
            )
    return lines


def suffix_speculation(s: Store) -> list[str]:
    """The speculation rows that measured suffix decoding too: against llama.cpp's ngram-mod, over all rounds and over
    each start's first round (before either had seen an answer to the same prompt)."""
    measured = [r for r in s.of_kind("speculative") if "acceptance_suffix" in r.params]
    if not measured:
        return ["Not measured yet (`make bench-peer BENCH_ARGS=--peer-speculative-suffix`)."]
    lines = [
        "| CPU | file | text | streams | suffix / llama.cpp's ngram-mod | first round | drafts accepted |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in sorted(measured, key=lambda r: (r.cpu, r.params["format"], r.params["workload"] != "repeated")):
        value, low, high = r.params["suffix_vs_llama_cpp_ngram_mod"]
        first_low, first_high = r.params["first_round_suffix_vs_llama_cpp_ngram_mod"]
        lines.append(
            f"| {_label(CPUS, r.cpu)} | {_label(FORMATS, r.params['format'])} | {r.params['workload']} | "
            f"{r.params['concurrency']} | x{value:.2f} [{low:.2f}, {high:.2f}] | x{first_low:.2f}-{first_high:.2f} | "
            f"{r.params['acceptance_suffix']:.0%} |"
        )
    return lines


def peer_tables(s: Store) -> list[str]:
    """Per CPU class: every format and concurrency measured, ratios with their intervals, and where each comes from."""
    peers = s.of_kind("peer")
    out: list[str] = []
    for cpu in _ordered(sorted({r.cpu for r in peers}), CPUS):
        rows = [r for r in peers if r.cpu == cpu]
        out += [f"### {_label(CPUS, cpu)}", "", f"Machine: {rows[0].machine}.", ""]
        out += ["| weights | c | output tok/s | TTFT p50 | TPOT p50 |", "| --- | --- | --- | --- | --- |"]
        fmts = _ordered(list(dict.fromkeys(r.params["format"] for r in rows)), FORMATS)
        for fmt in fmts:
            cs = sorted({r.params["concurrency"] for r in rows if r.params["format"] == fmt})
            for c in cs:
                cells = [_peer(s, cpu, fmt, c, m) for m in ("output", "ttft", "tpot")]
                out.append(
                    f"| {_label(FORMATS, fmt)} | {c} | " + " | ".join(_ratio(x) if x else "" for x in cells) + " |"
                )
        out.append("")
        sources = dict.fromkeys(
            (r.params["format"], r.command, r.date, r.params.get("repetitions"), r.run, r.says) for r in rows
        )
        for fmt, command, date, n, run, says in sources:
            where = f", `{run}`" if run else ""
            note = f"; {says}" if says else ""
            out.append(f"- {_label(FORMATS, fmt)}: `{command}`, {date}, n={n}{where}{note}")
        out.append("")
    return out[:-1]


def quant_tables(s: Store) -> list[str]:
    """Per machine run: each quantized format's kernel candidates, decode and prefill at batch 1."""
    quant = s.of_kind("quant")
    out: list[str] = []
    runs = list(dict.fromkeys(r.key.split("/")[1] for r in quant))
    for run in runs:
        rows = [r for r in quant if r.key.split("/")[1] == run]
        first = rows[0]
        out += [f"**{first.machine}**, backend `{first.params['backend']}` (`{first.command}`, {first.date}):", ""]
        out += ["| format | kernel | knobs | decode tok/s | prefill tok/s |", "| --- | --- | --- | --- | --- |"]
        for d in (r for r in rows if r.params["metric"] == "decode"):
            p = s.rows.get(d.key.removesuffix("/decode") + "/prefill")
            knobs = f"`{d.params['knobs']}`" if d.params["knobs"] else ""
            out.append(
                f"| {d.params['format']} | `{d.params['kernel']}` | {knobs} | {d.figure().removesuffix(' tok/s')} | "
                f"{p.figure() if p else 'n/a'} |".replace(" tok/s", "")
            )
        out.append("")
    return out[:-1]


RENDERERS: dict[str, Callable[[Store], list[str]]] = {
    "which-to-pick": which_to_pick,
    "peer-tables": peer_tables,
    "quant-tables": quant_tables,
    "sizes": sizes,
    "depth": depth_table,
    "speculation": speculation,
    "suffix-speculation": suffix_speculation,
    "table-cpus": table_cpus,
}
BLOCK = re.compile(r"(<!-- rendered: (?P<name>[\w-]+) \(make docs\) -->\n)(?P<body>.*?)(<!-- end (?P=name) -->)", re.S)


def render(text: str, s: Store) -> str:
    def one(m: re.Match[str]) -> str:
        body = "\n".join(RENDERERS[m["name"]](s)) + "\n"
        return m.group(1) + body + m.group(4)

    return BLOCK.sub(one, text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="exit 1 if a document differs from what the store renders")
    args = parser.parse_args()
    stale = []
    for path in DOCUMENTS:
        text = path.read_text()
        new = render(text, store())
        if new != text:
            stale.append(path.relative_to(REPO))
            if not args.check:
                path.write_text(new)
    if args.check and stale:
        sys.exit(f"rendered from an older store: {', '.join(map(str, stale))} (run `make docs`)")
    print(("rewrote " + ", ".join(map(str, stale))) if stale else "documents match the store")


if __name__ == "__main__":
    main()
