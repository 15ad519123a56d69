"""Several models in one service (the `models` table): the memory each engine is planned in, and what of the table
fits this machine.

The rule: the memory limit (what is free at start, where that is less) is split evenly between the engines loaded at
once (max_loaded_models, default every listed model). Each engine is then planned as a single model is, inside its
share: its weights, the headroom its processes need, a KV cache of what is left, and the pre-flight check that one
request of its max context fits. A model that does not fit its share is told apart from one that does not fit the
machine even alone, with the numbers of both.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from service.facts.limits import Limits
from service.policy.engine.memory import gib
from service.policy.plan.decision import Decision, record
from service.settings import ListedModel, Settings


def loaded_at_once(settings: Settings) -> int:
    """How many engines of the table are planned to run together, at most."""
    listed = len(settings.models)
    return min(settings.max_loaded_models or listed, listed) if listed else 1


def engine_counts(settings: Settings) -> tuple[int, ...]:
    """The numbers of engines at once to plan the table for, the first that fits wins: the user's max_loaded_models
    alone, else every listed model down to the fewest that leaves an engine for the unpinned models."""
    most = loaded_at_once(settings)
    if settings.max_loaded_models is not None:
        return (most,)
    pinned = sum(entry.pinned for entry in settings.models)
    fewest = max(1, pinned + (pinned < len(settings.models)))
    return tuple(range(most, min(fewest, most) - 1, -1))


def engines_reason(settings: Settings, engines: int, fits: bool) -> str:
    listed = len(settings.models)
    if settings.max_loaded_models is not None:
        return f"max_loaded_models={settings.max_loaded_models} (set by the user)"
    if not fits:
        return f"no number of engines down to {engines} holds each listed model in its share of the memory"
    if engines == listed:
        return f"all {listed} listed models fit their shares at once"
    return (
        f"the {listed} listed models do not fit their shares together: {engines} at once, the most whose shares each "
        "hold any listed model; a load beyond stops the least recently used idle one"
    )


def memory_share(limits: Limits, engines: int) -> tuple[Limits, Decision]:
    """The limits one of `engines` engines is planned in, and the decision that says so."""
    if engines <= 1 or limits.memory_bytes is None:
        why = (
            "one engine loaded at once: the whole limit"
            if engines <= 1
            else "memory limit unknown: each engine planned alone"
        )
        return limits, record("model", "memory_share", limits.memory_bytes, why, "policy")
    whole, where = limits.memory_bytes, limits.memory_source
    free = limits.memory_available_bytes
    if free is not None and free < whole:
        whole, where = free, f"{where}, {gib(free)} of it free at start"
    share = whole // engines
    why = f"{gib(whole)} ({where}) split evenly between the {engines} engines of the model table loaded at once"
    shared = dataclasses.replace(
        limits,
        memory_bytes=share,
        memory_available_bytes=None,
        memory_source=f"1/{engines} of {gib(whole)} ({where})",
    )
    return shared, record("model", "memory_share", share, why, "policy")


def table_errors(
    entries: Sequence[ListedModel], engines: int, verdicts: Sequence[tuple[Sequence[str], Sequence[str]]]
) -> tuple[str, ...]:
    """`verdicts`: per entry, the errors of its plan in its share and with the machine to itself. Pinned models must
    all be loadable at once."""
    errors = []
    pinned = [e for e in entries if e.pinned]
    if len(pinned) > engines:
        errors.append(
            f"{len(pinned)} pinned models ({', '.join(e.name or e.source for e in pinned)}) but {engines} engine(s) "
            "loaded at once: pinned engines are never stopped, so they must all fit together (raise "
            "max_loaded_models or pin fewer)"
        )
    unpinned = [e for e in entries if not e.pinned]
    if pinned and unpinned and len(pinned) >= engines:
        errors.append(
            f"{len(pinned)} pinned model(s) take all {engines} engine(s) loaded at once: "
            f"{', '.join(e.name or e.source for e in unpinned)} could never load (raise max_loaded_models or pin fewer)"
        )
    for entry, (in_share, alone) in zip(entries, verdicts, strict=True):
        name = entry.name or entry.source
        if alone:
            errors.append(f"{name}: refused even with the machine to itself: {'; '.join(alone)}")
        elif in_share:
            errors.append(
                f"{name}: fits this machine alone but not in 1/{engines} of it (lower max_loaded_models, or its "
                f"max_model_len): {'; '.join(in_share)}"
            )
    return tuple(errors)
