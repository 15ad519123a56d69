"""Promote a finished run's peer comparisons into the measurement store (service/measurements/peers.yaml):
`python -m bench.promote bench/results/<stamp> [--cpu zen4]`, then `make docs` puts them everywhere they show.

One row per (CPU class, format, concurrency, metric), ratio ours / llama.cpp with its 95% interval; a row already in
the store under the same key is replaced by the newer run's."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import yaml

from bench.peer import USER_FILE, comparisons
from harness.models import DEFAULT_SIZE
from service.measurements.store import STORE, Row, read_store

PEERS = STORE / "peers.yaml"
METRICS = {"output_throughput": "output", "ttft_p50_ms": "ttft", "tpot_p50_ms": "tpot"}


def peer_rows(results: dict[str, Any], run: str, cpu: str | None = None) -> list[Row]:
    m = results["machine"]
    cls = cpu or m["microarchitecture"]
    machine = f"{m['cpu']} (family/model {m['family_model']}, {m['microarchitecture']}), backend {m['backend']}"
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
            rows.append(
                Row(
                    key=f"peer/{cls}/{fmt}/c{c.concurrency}/{short}",
                    cpu=cls,
                    machine=machine,
                    command=results["command"],
                    date=results["started"][:16].replace("T", " "),
                    value=round(e.value, 3),
                    unit="x",
                    interval=(round(e.low, 3), round(e.high, 3)) if e.low is not None and e.high is not None else None,
                    params={
                        "format": fmt,
                        "concurrency": c.concurrency,
                        "metric": short,
                        "repetitions": e.n,
                        **({"size": size} if size != DEFAULT_SIZE else {}),
                    },
                    run=run,
                )
            )
    return rows


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


def promote(run_dir: Path, cpu: str | None = None, path: Path = PEERS) -> list[Row]:
    new = peer_rows(json.loads((run_dir / "results.json").read_text()), str(run_dir), cpu)
    if not new:
        raise SystemExit(f"{run_dir} has no peer comparisons to promote")
    existing = [r for r in read_store(path.parent).of_kind("peer")] if path.exists() else []
    keys = {r.key for r in new}
    write_rows(path, [r for r in existing if r.key not in keys] + new)
    return new


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("run", type=Path, help="bench/results/<stamp>")
    parser.add_argument("--cpu", help="the CPU class to file it under (default: the run's microarchitecture)")
    args = parser.parse_args()
    rows = promote(args.run, args.cpu)
    print(f"promoted {len(rows)} rows into {PEERS}; run `make docs`")


if __name__ == "__main__":
    main()
