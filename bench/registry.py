"""The parts of `make bench`, in the order they run: one entry each. The CLI (`--<part>` / `--no-<part>`,
`--only-<part>`, `--<part>-<option>`), `--quick`, the summary and the report's sections are all derived from this
list. Adding a part is one entry here, over a module with its `run(ctx, options) -> Output` and `section(results)`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bench.context import Context
from bench.output import Output
from bench.parts import decode, depth, dtype, frontend, peer, preload, quality, quant_kernels, replay, warm_start
from bench.stats import Comparison, DecodeResult


@dataclass(frozen=True)
class Part:
    name: str  # CLI name
    key: str  # its results in results.json
    help: str
    run: Callable[[Context, Any], Output]
    # its part of table.md, from results.json and the run's comparisons and decode rows (it picks its own)
    section: Callable[[dict[str, Any], list[Comparison], list[DecodeResult]], list[str]]
    options: type | None = None  # a dataclass of its own options, each a `--<name>-<field>` flag
    quick: bool = False  # part of `--quick`
    comparisons: Callable[[dict[str, Any]], list[Comparison]] | None = None  # recomputed from results.json
    decoded: Callable[[dict[str, Any]], list[DecodeResult]] | None = None

    def defaults(self) -> Any:
        return self.options() if self.options else None


PARTS: tuple[Part, ...] = (
    Part(
        "frontend",
        "frontend",
        "ours vs vLLM's own server on the same engine",
        frontend.run_frontend,
        frontend.frontend_section,
        quick=True,
        comparisons=frontend.frontend_comparisons,
    ),
    Part(
        "policy",
        "policy_vs_defaults",
        "vLLM with the policy's arguments vs vLLM's defaults",
        frontend.run_policy,
        frontend.policy_section,
        frontend.PolicyOptions,
        comparisons=frontend.policy_comparisons,
    ),
    Part(
        "decode",
        "decode",
        "batch-1 decode vs the bandwidth ceiling",
        decode.run_decode,
        decode.section,
        decode.DecodeOptions,
        decoded=decode.decoded,
    ),
    Part(
        "preload",
        "preload",
        "native decode with and without the preload",
        preload.run,
        preload.section,
        preload.PreloadOptions,
    ),
    Part("dtype", "dtype", "decode bf16 against fp32, side by side", dtype.run, dtype.section, dtype.DtypeOptions),
    Part("warm-start", "warm_start", "start to ready, cold and warm compile cache", warm_start.run, warm_start.section),
    Part(
        "quant",
        "quant_kernels",
        "quantized linear kernels per format",
        quant_kernels.run,
        quant_kernels.section,
        quant_kernels.QuantOptions,
    ),
    Part(
        "peer",
        "peer",
        "llama.cpp's server on the same weights (built by `make bench-tools`)",
        peer.run,
        peer.section,
        peer.PeerOptions,
        comparisons=peer.comparisons,
    ),
    Part(
        "depth",
        "depth",
        "prefill and decode at prompt depths up to 32k tokens against llama.cpp's server (built by `make bench-tools`)",
        depth.run,
        depth.section,
        depth.DepthOptions,
        comparisons=depth.comparisons,
    ),
    Part(
        "replay",
        "agent_replay",
        "a recorded Claude Code session replayed against llama.cpp's server on the same file (`make bench-tools`)",
        replay.run,
        replay.section,
        replay.ReplayOptions,
    ),
    Part(
        "quality",
        "quality",
        "perplexity of the default model: llama.cpp vs transformers vs the service (built by `make bench-tools`)",
        quality.run,
        quality.section,
        quality.QualityOptions,
    ),
)
BY_NAME = {p.name: p for p in PARTS}
