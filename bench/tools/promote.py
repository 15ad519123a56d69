"""Promote a finished run's peer comparisons into the measurement store (service/measurements/peers.yaml,
speculative.yaml for its speculative-decoding rows, depth.yaml for its depth sweep, table_cpus.yaml for
bench/tools/table_cpus.py's run):
`python -m bench.tools.promote bench/results/<stamp> [--cpu zen4]`, then `make docs` puts them everywhere they show.

One row per (CPU class, format, concurrency, metric), ratio ours / llama.cpp with its 95% interval; one per (CPU
class, file, concurrency, workload) for speculation, ours drafting / llama.cpp's lookup; one per (CPU class, file,
depth, prefill or decode) for the depth sweep, as a speed ratio. A row already in the store under the same key is
replaced by the newer run's."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import yaml

from bench.parts import depth
from bench.parts.peer import DEFAULT_GGUF, FORMATS, USER_FILE, comparisons
from bench.parts.speculative import HEADLINE, SUFFIX_HEADLINE
from bench.stats import Estimate, estimate
from harness.models import DEFAULT_SIZE
from service.measurements.store import STORE, Row, read_store

PEERS = STORE / "peers.yaml"
SPECULATIVE = STORE / "speculative.yaml"
DEPTH = STORE / "depth.yaml"
TABLE_CPUS = STORE / "table_cpus.yaml"
METRICS = {"output_throughput": "output", "ttft_p50_ms": "ttft", "tpot_p50_ms": "tpot"}


def _machine(results: dict[str, Any], cpu: str | None) -> tuple[str, str]:
    m = results["machine"]
    return cpu or m["microarchitecture"], (
        f"{m['cpu']} (family/model {m['family_model']}, {m['microarchitecture']}), backend {m['backend']}"
    )


def _ratio_row(results: dict[str, Any], run: str, cpu: str | None, key: str, e: Estimate, **fields: Any) -> Row:
    """A ratio of the run as a store row: its CPU class and machine, command, date, value and 95% interval."""
    cls, machine = _machine(results, cpu)
    return Row(
        key=key,
        cpu=cls,
        machine=machine,
        command=results["command"],
        date=results["started"][:16].replace("T", " "),
        value=round(e.value, 3),
        unit="x",
        interval=(round(e.low, 3), round(e.high, 3)) if e.low is not None and e.high is not None else None,
        run=run,
        **fields,
    )


def peer_rows(results: dict[str, Any], run: str, cpu: str | None = None) -> list[Row]:
    cls = _machine(results, cpu)[0]
    rows = []
    # The size sweep's formats are rows of their own: "1.5b-q4_0-gguf" beside the 0.5 B bench model's "q4_0-gguf".
    size = results.get("peer", {}).get("size") or DEFAULT_SIZE
    for c in comparisons(results):
        fmt = c.name.removeprefix("peer-")
        if fmt == USER_FILE:  # a user's own file stays in its run: the store's rows are the project's formats
            continue
        fmt = fmt if size == DEFAULT_SIZE else f"{size}-{fmt}"
        for metric, short in METRICS.items():
            e = c.estimates.get(metric)
            if e is None:
                continue
            params = {
                "format": fmt,
                "concurrency": c.concurrency,
                "metric": short,
                "repetitions": e.n,
                **({"size": size} if size != DEFAULT_SIZE else {}),
            }
            rows.append(_ratio_row(results, run, cpu, f"peer/{cls}/{fmt}/c{c.concurrency}/{short}", e, params=params))
    return rows


def depth_rows(results: dict[str, Any], run: str, cpu: str | None = None) -> list[Row]:
    """Per file and depth: prefill and decode, ours / llama.cpp as speeds. A run whose llama.cpp ran with its
    repacking off says so in each row (such a peer is slower than a user's)."""
    data = results.get("depth") or {}
    if not data.get("runs"):
        return []
    cls = _machine(results, cpu)[0]
    size = data.get("size") or DEFAULT_SIZE
    compared = depth.comparisons(results)
    out = []
    # against llama.cpp, and (--depth-kv, --depth-chunk, --depth-dtype) a variant against the policy's choice, in the same service
    for r in [*depth.rows(data, compared), *depth.variant_rows(data, compared)]:
        if r["format"] == USER_FILE:
            continue
        bench_model = FORMATS[r["format"]][0] != DEFAULT_GGUF
        fmt = f"{size}-{r['format']}" if bench_model and size != DEFAULT_SIZE else r["format"]
        kind = r.get("kind")
        # how llama.cpp was built and whether it ran handicapped, where llama.cpp is the baseline
        built = f"llama.cpp built with {data['llama_cpp_flags']}" if data.get("llama_cpp_flags") else ""
        says = "; ".join(x for x in (built, data.get("repack_off", "")) if x) if kind is None else ""
        for metric in ("prefill", "decode"):
            value, low, high = r[f"{metric}_ratio"]
            e = Estimate(metric, "ratio", value, low, high, ())
            params = {"format": fmt, "depth": r["depth"], "metric": metric, "repetitions": r["repetitions"]}
            if kind is None and data.get("repack_off"):
                params["llama_cpp_repacking"] = "off"
            if kind is None and data.get("llama_cpp_flags"):
                params["llama_cpp_flags"] = data["llama_cpp_flags"]
            key = f"depth/{cls}/{fmt}/{r['depth']}/{metric}"
            if kind is not None:
                params |= {
                    "variant": kind,
                    kind: r["value"],
                    "against": f"the service with the policy's {depth.VARIANT_LABELS[kind]}",
                }
                key += f"-{kind}-{r['value']}"
            out.append(_ratio_row(results, run, cpu, key, e, params=params, says=says))
    return out


def speculative_rows(results: dict[str, Any], run: str, cpu: str | None = None) -> list[Row]:
    """The peer part's speculation (bench/parts/peer.py `speculation`): ours with n-gram drafting / llama.cpp's server with
    its prompt lookup, per file, concurrency and workload, with the other ratios and the acceptance as params."""
    cls = _machine(results, cpu)[0]
    size = results.get("peer", {}).get("size") or DEFAULT_SIZE
    rows = []
    for fmt, r in (results.get("peer", {}).get("speculative") or {}).items():
        if fmt == USER_FILE:
            continue
        # the bench model's files at a swept size are rows of their own; the default model's file has one size
        name = fmt if size == DEFAULT_SIZE or FORMATS[fmt][0] == DEFAULT_GGUF else f"{size}-{fmt}"
        for key, samples in r["ratios"][HEADLINE].items():
            workload, c = key.split("/")
            e = estimate(key, "ratio", samples)
            others = {
                ratio.replace("/", "_vs_").replace("-", "_").replace(".", "_"): _rounded(r["ratios"][ratio][key])
                for ratio in r["ratios"]
                if ratio != HEADLINE
            }
            tok_s = r["median_tok_s"][key]
            says = (
                f"{workload} text at {c.removeprefix('c')} stream(s), {Path(r['peer_file']).name}: ours with n-gram "
                f"drafting {tok_s['ngram']:.1f} tok/s, llama.cpp with its lookup {tok_s['llama.cpp-lookup']:.1f} "
                f"(medians); ours accepted {r['acceptance'][workload]:.0%} of its drafts"
            )
            params = {
                "format": name,
                "concurrency": int(c.removeprefix("c")),
                "workload": workload,
                "acceptance": round(r["acceptance"][workload], 3),
                "repetitions": e.n,
                **others,
                **_suffix_params(r, key, workload),
                **({"size": size} if name != fmt else {}),
            }
            key = f"speculative/{cls}/{name}/{c}/{workload}"
            rows.append(_ratio_row(results, run, cpu, key, e, says=says, params=params))
    return rows


def table_cpus_rows(results: dict[str, Any], run: str, cpu: str | None = None) -> list[Row]:
    """bench/tools/table_cpus.py: a model table's two engines on split CPUs / shared ones, decoding alone and together."""
    if "table_cpus" not in results:
        return []
    cls, of = _machine(results, cpu)[0], results["table_cpus"]
    fmt = f"{of['size']}-{of['format']}"
    says = {
        "together": "two engines of the table decoding a stream each at once, summed tok/s, split / shared",
        "alone": "one engine decoding while the other is idle, split / shared",
    }
    rows = []
    for what, e in results["estimates"].items():
        estimated = Estimate(what, "ratio", e["value"], e["low"], e["high"], tuple(results["samples"][what]))
        params = {"format": fmt, "max_tokens": of["max_tokens"], "rounds": of["rounds"], "repetitions": e["n"]}
        params |= {f"slots_{mode}": plan["slots"] for mode, plan in results["plans"].items()}
        key = f"table-cpus/{cls}/{fmt}/{what}"
        rows.append(_ratio_row(results, run, cpu, key, estimated, says=says[what], params=params))
    return rows


def _suffix_params(r: dict[str, Any], key: str, workload: str) -> dict[str, Any]:
    """Where suffix decoding was measured (--peer-speculative-suffix): its acceptance, and its ratios over each start's
    first round alone, before it had seen an answer to the same prompt."""
    if "suffix" not in r.get("acceptance_by_method", {}):
        return {}
    first = {
        "first_round_" + ratio.replace("/", "_vs_").replace("-", "_").replace(".", "_"): r["first_round"][ratio][key]
        for ratio in (SUFFIX_HEADLINE, "suffix/off")
    }
    return {"acceptance_suffix": round(r["acceptance_by_method"]["suffix"][workload], 3), **first}


def _rounded(samples: list[float]) -> list[float]:
    """A ratio's value and 95% interval, as a params entry."""
    e = estimate("", "ratio", samples)
    return [round(x, 3) for x in (e.value, e.low if e.low is not None else e.value, e.high or e.value)]


def write_rows(path: Path, rows: list[Row]) -> None:
    """The file's leading comment kept, then one row per line (flow style: a row added is a line in the diff)."""
    head = (
        "".join(line + "\n" for line in path.read_text().splitlines() if line.startswith("#")) if path.exists() else ""
    )
    body = "".join(
        "- "
        + yaml.safe_dump(
            r.model_dump(mode="json", exclude_defaults=True), default_flow_style=True, width=100000, sort_keys=False
        )
        for r in rows
    )
    path.write_text(head + body)


# What must match for two runs' depth repetitions to be pooled: the machine, the file and the way it was measured.
POOLED_KEYS = ("size", "llama_cpp_flags", "output_len", "requests", "repack_off")


def pooled_depth(results: dict[str, Any], others: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """`results` with the depth repetitions of `others` (run, results) added to the comparisons it has, each run's
    repetitions numbered apart: restarts of the same command on the same machine, pooled for a tighter interval
    (a deep prefill on llama.cpp takes half an hour a repetition). Refuses runs measured otherwise."""
    data = results["depth"]
    names = {r["comparison"] for r in data["runs"]}
    offset = max(r["rep"] for r in data["runs"]) + 1
    runs = list(data["runs"])
    for run, other in others:
        theirs = other.get("depth") or {}
        differ = [k for k in POOLED_KEYS if theirs.get(k) != data.get(k)]
        if other["machine"] != results["machine"] or differ or not theirs.get("runs"):
            raise SystemExit(
                f"{run}: not pooled, measured otherwise ({', '.join(differ) or 'machine or no depth runs'})"
            )
        added = [r | {"rep": r["rep"] + offset} for r in theirs["runs"] if r["comparison"] in names]
        if not added:
            raise SystemExit(f"{run}: none of its depth comparisons is in the first run")
        runs += added
        offset = max(r["rep"] for r in runs) + 1
    return results | {"depth": data | {"runs": runs}}


def promote(
    run_dir: Path,
    cpu: str | None = None,
    path: Path = PEERS,
    speculative: Path = SPECULATIVE,
    depth_store: Path = DEPTH,
    table_cpus: Path = TABLE_CPUS,
    pool: tuple[Path, ...] = (),
) -> list[Row]:
    results = json.loads((run_dir / "results.json").read_text())
    run = str(run_dir)
    if pool:
        others = [(str(d), json.loads((d / "results.json").read_text())) for d in pool]
        results = pooled_depth(results, others)
        run = " + ".join([run, *(name for name, _ in others)])
    promoted = []
    for kind, new, into in (
        ("peer", peer_rows(results, str(run_dir), cpu), path),
        ("speculative", speculative_rows(results, str(run_dir), cpu), speculative),
        ("depth", depth_rows(results, run, cpu), depth_store),
        ("table-cpus", table_cpus_rows(results, str(run_dir), cpu), table_cpus),
    ):
        if new:
            existing = read_store(into.parent).of_kind(kind) if into.exists() else []
            keys = {r.key for r in new}
            write_rows(into, [r for r in existing if r.key not in keys] + new)
            promoted += new
    if not promoted:
        raise SystemExit(f"{run_dir} has no peer comparisons to promote")
    return promoted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("run", type=Path, help="bench/results/<stamp>")
    parser.add_argument("--cpu", help="the CPU class to file it under (default: the run's microarchitecture)")
    parser.add_argument(
        "--pool",
        type=Path,
        action="append",
        default=[],
        help="another run of the same depth command on the same machine: its repetitions join the first run's",
    )
    args = parser.parse_args()
    rows = promote(args.run, args.cpu, pool=tuple(args.pool))
    print(f"promoted {len(rows)} rows into {PEERS.parent}; run `make docs`")


if __name__ == "__main__":
    main()
