"""GGUF conversion's tensor-name map: transformers' `get_gguf_hf_weights_map` as it is, against the service's
`weights_map` (the same function, gguf-py's name map built once), on Llama skeletons of growing depth (meta device: no
weights). Both must give the same map; the time is what a GGUF model's first start spends on it.

  .venv/bin/python -m bench.tools.gguf_names [--layers 30 32 80] [--repetitions 3]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any


def skeleton(layers: int) -> Any:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(
        "llama", hidden_size=4096, intermediate_size=11008, num_hidden_layers=layers, num_attention_heads=32
    )
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def timed(build: Callable[[Any, Any], dict[str, str]], model: Any, repetitions: int) -> tuple[float, dict[str, str]]:
    """Median seconds of `repetitions` builds of the model's map, and the map."""
    from transformers.modeling_gguf_pytorch_utils import TensorProcessor

    times, names = [], {}
    for _ in range(repetitions):
        started = time.perf_counter()
        names = build(model, TensorProcessor(config={}))
        times.append(time.perf_counter() - started)
    return statistics.median(times), names


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, nargs="+", default=[30, 32, 80])
    parser.add_argument("--repetitions", type=int, default=3)
    args = parser.parse_args()
    from transformers.modeling_gguf_pytorch_utils import get_gguf_hf_weights_map

    from service.models.gguf_convert import weights_map

    print("| layers | transformers (s) | service (s) | speed-up |\n| --- | --- | --- | --- |")
    for layers in args.layers:
        model = skeleton(layers)
        theirs, expected = timed(get_gguf_hf_weights_map, model, args.repetitions)
        ours, names = timed(weights_map, model, args.repetitions)
        assert names == expected, f"{layers} layers: the maps differ"
        print(f"| {layers} | {theirs:.2f} | {ours:.3f} | x{theirs / ours:.0f} |", flush=True)


if __name__ == "__main__":
    main()
