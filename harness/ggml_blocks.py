"""Rows of ggml blocks of any GGUF type from float values, for the tests' tiny GGUF files and the kernel benches:
gguf-py's quantizers where it has one; K-quant types, which gguf-py cannot quantize, get random blocks with small,
finite fp16 scales (what they decode to is then the weights)."""

from __future__ import annotations

import numpy as np

K_QUANTS = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")


def k_quant_blocks(rows: int, cols: int, qtype, rng: np.random.Generator) -> np.ndarray:
    """Random K-quant blocks whose fp16 scales are small and finite."""
    from gguf import GGML_QUANT_SIZES

    block, size = GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, size=(rows, cols // block, size), dtype=np.uint8)
    scale = np.frombuffer(np.float16(1e-3).tobytes(), dtype=np.uint8)
    # Where each K-quant stores its fp16 super-block scale d (and dmin): ggml-common.h block layouts.
    offsets = {"Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}[qtype.name]
    for offset in offsets:
        blocks[:, :, offset : offset + 2] = scale
    return blocks.reshape(rows, -1)


def blocks_of(values: np.ndarray, type_name: str, rng: np.random.Generator) -> np.ndarray:
    """uint8 rows of `type_name` blocks for a 2-D float array (random blocks for K-quants)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    qtype = GGMLQuantizationType[type_name]
    if type_name in K_QUANTS:
        return k_quant_blocks(values.shape[0], values.shape[1], qtype, rng)
    return quantize(values.astype(np.float32), qtype)
