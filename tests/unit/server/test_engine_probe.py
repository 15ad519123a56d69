"""The hang probe: a pending probe older than the stall limit is a hung engine core; an answered one is not. And a
start-up step that waits on the engine ends once vLLM marks the engine dead."""

from __future__ import annotations

import asyncio

from service.server.supervision.engine_probe import PROBE_INTERVAL_S, HangProbe
from service.server.supervision.engine_start import DEAD_POLL_S, EngineDied, unless_dead


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_an_unanswered_probe_is_a_hang_once_it_is_older_than_the_limit():
    async def scenario() -> list[str | None]:
        clock, never = Clock(), asyncio.Event()
        probe = HangProbe(never.wait, stall_s=10, clock=clock)
        seen = [probe.look()]  # too early for a probe
        clock.now += PROBE_INTERVAL_S
        seen.append(probe.look())  # sends it
        clock.now += 9.9
        seen.append(probe.look())
        clock.now += 0.2
        seen.append(probe.look())
        probe.close()
        return seen

    early, sent, waiting, hung = asyncio.run(scenario())
    assert (early, sent, waiting) == (None, None, None)
    assert hung is not None and "engine core hung" in hung and "for 10 s" in hung and "engine_stall_seconds 10" in hung


def test_an_engine_core_that_answers_is_never_hung_however_long_it_runs():
    async def scenario() -> list[str | None]:
        clock, asked = Clock(), []

        async def answer() -> bool:
            asked.append(clock.now)
            return False

        probe = HangProbe(answer, stall_s=2, clock=clock)
        seen = []
        for _ in range(100):
            clock.now += 1
            seen.append(probe.look())
            await asyncio.sleep(0)  # the engine core answers between two looks
        return seen + [len(asked)]

    *seen, asked = asyncio.run(scenario())
    assert seen == [None] * 100 and asked >= 100 // (PROBE_INTERVAL_S + 1)


def test_a_probe_that_raises_counts_as_answered_and_is_retrieved():
    async def scenario() -> str | None:
        clock = Clock()

        async def dead() -> None:
            raise RuntimeError("engine dead")  # the watchdog learns that from vLLM's errored flag

        probe = HangProbe(dead, stall_s=1, clock=clock)
        clock.now += PROBE_INTERVAL_S
        probe.look()
        await asyncio.sleep(0)
        clock.now += 5
        return probe.look()

    assert asyncio.run(scenario()) is None


class Engine:
    errored = False


def test_a_step_the_engine_never_answers_ends_once_the_engine_is_dead():
    """vLLM fails only the calls made after its engine died: one pending at the death waited for ever."""

    async def scenario() -> tuple[bool, float, bool]:
        engine, never = Engine(), asyncio.Event()
        step = asyncio.ensure_future(never.wait())
        loop = asyncio.get_running_loop()
        loop.call_later(0.3, setattr, engine, "errored", True)
        started = loop.time()
        try:
            await unless_dead(engine, step)
        except EngineDied as exc:
            took = loop.time() - started
            await asyncio.sleep(0)  # the cancellation it asked for runs
            return exc.engine is engine, took, step.cancelled()
        return False, 0.0, False

    named, took, cancelled = asyncio.run(scenario())
    assert named and cancelled
    assert 0.3 <= took <= 0.3 + 2 * DEAD_POLL_S, took


def test_a_step_of_a_live_engine_gives_its_result_however_long_it_takes():
    async def scenario() -> str:
        async def slow() -> str:
            await asyncio.sleep(3 * DEAD_POLL_S)
            return "answered"

        return await unless_dead(Engine(), slow())

    assert asyncio.run(scenario()) == "answered"
