"""Measured speed of the quantized linear kernels: the data the quantization policy's defaults come from.

The store's quant rows (service/measurements/quant_kernels.yaml), per (machine, format, kernel candidate), from
`bench/parts/quant_kernels.py` (vLLM's offline `LLM`, one engine per
candidate, enforce_eager, the ~0.5 B random Llama of harness/models.py quantized by round-to-nearest; decode
at batch 1 and prefill, median of repetitions with their min-max spread). Add a row set when a new machine is
measured; the policy cites what it finds here for its backend and says when nothing was measured.
"""

from __future__ import annotations

from dataclasses import dataclass

from service.measurements.store import store


@dataclass(frozen=True)
class Machine:
    name: str
    backend: str  # the service backend it ran on
    how: str  # command, date, runs


@dataclass(frozen=True)
class Measurement:
    machine: Machine
    format: str  # "bf16", "w8a8", "w8a8-static", "w4a16" (the schemes of harness/quantized_models.py)
    kernel: str  # kernel key of service/policy/linear/quant.py KERNELS ("bf16" for the unquantized reference)
    knobs: str  # the environment the candidate ran with
    decode_tok_s: float
    prefill_tok_s: float | None
    decode_spread: tuple[float, float] | None = None  # (min, max) over repetitions; None for a single run
    prefill_spread: tuple[float, float] | None = None
    key: str = ""  # its rows in the store: <key>/decode, <key>/prefill

    def describe(self) -> str:
        def fmt(value: float | None, spread: tuple[float, float] | None) -> str:
            if value is None:
                return "n/a"
            return f"{value:.1f}" + (f" [{spread[0]:.1f}-{spread[1]:.1f}]" if spread else " (one run)")

        return (
            f"decode {fmt(self.decode_tok_s, self.decode_spread)} tok/s, "
            f"prefill {fmt(self.prefill_tok_s, self.prefill_spread)} tok/s"
            + (f" (measured: {self.key})" if self.key else "")
        )


def _measurements() -> tuple[Measurement, ...]:
    """The store's quant rows (service/measurements/quant_kernels.yaml), a decode and a prefill row per candidate."""
    rows = store().of_kind("quant")
    out = []
    for decode in (r for r in rows if r.params["metric"] == "decode"):
        prefill = store().rows.get(decode.key.removesuffix("/decode") + "/prefill")
        how = f"{decode.command}, {decode.date}" + (f", {decode.says}" if decode.says else "")
        out.append(
            Measurement(
                Machine(decode.machine, decode.params["backend"], how),
                decode.params["format"],
                decode.params["kernel"],
                decode.params["knobs"],
                decode.value or 0.0,
                prefill.value if prefill else None,
                decode.spread,
                prefill.spread if prefill else None,
                decode.key.removesuffix("/decode"),
            )
        )
    return tuple(out)


MEASUREMENTS = _measurements()


def find(backend: str, format: str, kernel: str) -> Measurement | None:
    """The first machine's row for this backend, format and kernel."""
    return next(
        (m for m in MEASUREMENTS if m.machine.backend == backend and m.format == format and m.kernel == kernel),
        None,
    )


def cite(backend: str, format: str, kernels: tuple[str, ...]) -> str:
    """'measured on <machine> (<how>): <kernel>: <numbers>; ...' per machine that measured any of the kernels on this
    backend (machines differ: a Zen 4 and a Zen 5 are both `zen`, and only rows of one machine compare)."""
    rows = [m for m in MEASUREMENTS if m.machine.backend == backend and m.format == format and m.kernel in kernels]
    if not rows:
        return f"not measured on the {backend} backend yet (bench/parts/quant_kernels.py measures it)"
    machines = list(dict.fromkeys(m.machine for m in rows))
    return "; ".join(
        f"measured on {machine.name} ({machine.how}): "
        + "; ".join(f"{m.kernel}: {m.describe()}" for m in rows if m.machine == machine)
        for machine in machines
    )
