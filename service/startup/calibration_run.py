"""The calibration step: times the candidates of the policy's open speed decisions (report.plan.questions) on the
engine's own compute CPUs, with its thread count, its preloads and platform, in a child process
(service/startup/calibration_timer.py); stores the timings in cache_dir, keyed by what they depend on; and gives the policy's
verdicts on them (service/policy/plan/calibration.py). A warm start with the same key reads the stored timings and
times nothing."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Literal

from service.cache.atomic_dir import replace_file
from service.policy.plan.calibration import PREFILL_M, Mode, Question, Timing, Verdict, cache_key, decide
from service.startup.report import StartupReport

log = logging.getLogger("service.startup.calibration_run")

ROUNDS = 7
TIMEOUT_S = 180  # per attempt; a 2-core machine times a small model's question in ~20 s
HARNESS = Path(__file__).with_name("calibration_timer.py")  # what takes the timings (run as a child)


def machine(report: StartupReport) -> dict[str, Any]:
    """What timings depend on besides the questions: the CPU (not its microcode), where the engine runs, software."""
    cpu, sw, limits = report.hardware.cpu, report.software, report.hardware.limits
    threads = report.plan.threads
    return {
        "cpu": [cpu.vendor, cpu.model_name, cpu.family, cpu.model, cpu.stepping, sorted(cpu.flags - {"microcode"})],
        "compute_cpus": sorted(threads.ranks[0]) if threads and threads.ranks else sorted(limits.allowed_cpus),
        "cpu_quota": limits.cpu_quota,
        "software": [sw.service, sw.torch, sw.vllm, sw.zentorch, sw.auto_round_lib],
        # A mended harness times again: timings it took before (a candidate it failed to build) are not reused.
        "harness": hashlib.sha256(HARNESS.read_bytes()).hexdigest()[:16],
        "env": {k: v for k, v in sorted(report.plan.env.items()) if k.startswith(("VLLM_", "SERVICE_", "LD_PRELOAD"))},
    }


def _time(report: StartupReport, questions: tuple[Question, ...], cpus: list[int]) -> dict[str, Any]:
    """Every candidate timed: those that run in the engine's environment in one child, each other environment
    (another backend's platform and preloads, taken at a process's start) in a child of its own, one after the
    other; their rounds are paired by number."""
    groups: dict[str, dict[str, str]] = {}
    for q in questions:
        for c in q.candidates:
            groups.setdefault(json.dumps(c.process_env, sort_keys=True), dict(c.process_env))
    engine_env = {k: v for k, v in os.environ.items() if k not in report.plan.env}
    merged: dict[str, Any] = {"answers": {}, "crashed": {}, "bandwidth_gb_s": []}
    for key, process_env in groups.items():
        asked = tuple(
            dataclasses.replace(q, candidates=part)
            for q in questions
            if (part := tuple(c for c in q.candidates if json.dumps(c.process_env, sort_keys=True) == key))
        )
        env = {**engine_env, **(process_env or report.plan.env), "OMP_NUM_THREADS": str(len(cpus))}
        result = _time_in_child(asked, cpus, env)
        for answer in result["answers"]:
            merged["answers"].setdefault(answer["decision"], []).extend(answer["timings"])
        merged["crashed"] |= result["crashed"]
        merged["bandwidth_gb_s"] += result["bandwidth_gb_s"]
    bandwidth = merged["bandwidth_gb_s"]
    return {
        "answers": [{"decision": d, "timings": t} for d, t in merged["answers"].items()],
        "crashed": merged["crashed"],
        "bandwidth_gb_s": [bandwidth[0], bandwidth[-1]],
        "processes": len(groups),
    }


def _time_in_child(questions: tuple[Question, ...], cpus: list[int], env: dict[str, str]) -> dict[str, Any]:
    """Run one timing child; a candidate that kills it is dropped and the rest timed again, the crash recorded."""
    crashed: dict[str, str] = {}
    while True:
        asked = [
            q.as_dict() | {"candidates": [dataclasses.asdict(c) for c in q.candidates if c.name not in crashed]}
            for q in questions
        ]
        request = json.dumps({"questions": asked, "rounds": ROUNDS, "prefill_m": PREFILL_M})
        proc = subprocess.Popen(
            [sys.executable, "-m", "service.startup.calibration_timer"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            preexec_fn=lambda: os.sched_setaffinity(0, cpus),
        )
        assert proc.stdin and proc.stderr and proc.stdout
        # A candidate that hangs is killed like one that crashes: a start is never held up by more than this.
        watchdog = threading.Timer(TIMEOUT_S, proc.kill)
        watchdog.start()
        try:
            proc.stdin.write(request)
            proc.stdin.close()
            current, tail = "", []
            for line in proc.stderr:
                line = line.rstrip()
                tail = (tail + [line])[-20:]
                if line.startswith(("building ", "timing ")):
                    current = line.split(" ", 1)[1]
                elif line.startswith("calibration "):
                    log.info("%s", line)
            out = proc.stdout.read()
            code = proc.wait()
        finally:
            watchdog.cancel()
        if code == 0:
            result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])  # the last line: libraries may print
            result["crashed"] = crashed
            return result
        if not current or current in crashed:
            raise RuntimeError(f"the timing process failed (exit {code}): {' | '.join(tail[-5:])}")
        how = (
            f"did not finish in {TIMEOUT_S} s"
            if code == -signal.SIGKILL
            else f"crashed the timing process (exit {code})"
        )
        crashed[current] = how
        log.warning("calibration: %s %s; timing the others again", current, crashed[current])


def _verdicts(questions: tuple[Question, ...], stored: dict[str, Any], path: Path) -> dict[str, Verdict]:
    answers = {a["decision"]: a["timings"] for a in stored["answers"]}
    verdicts = {}
    for q in questions:
        timings = [
            Timing(
                t["candidate"],
                tuple(t.get("decode_s", ())),
                tuple(t.get("prefill_s", ())),
                t.get("error"),
                t.get("max_rel_err"),
            )
            for t in answers.get(q.decision, [])
        ]
        timings += [Timing(name, error=why) for name, why in stored.get("crashed", {}).items()]
        verdict = decide(q, tuple(timings))
        where = (
            f"timed {stored.get('date')} on CPUs {stored.get('cpus')} in {stored.get('seconds')} s, read bandwidth "
            f"{stored.get('bandwidth_gb_s')} GB/s before/after"
            + (
                f" ({stored['processes']} processes: another backend's candidates in their own, rounds paired by number)"
                if stored.get("processes", 1) > 1
                else ""
            )
            + f"; {path}"
        )
        verdicts[q.decision] = dataclasses.replace(verdict, reason=f"{verdict.reason}; {where}")
    return verdicts


def calibrate(report: StartupReport, cache_dir: Path, mode: Mode | Literal["cached"]) -> dict[str, Verdict]:
    """Verdicts on the report's questions: from the stored timings for this key, or timed now (mode auto on a miss,
    force always); `cached` only reads (detect without --calibrate); `off` none."""
    questions = report.plan.questions
    if mode == "off" or not questions or not report.ok:
        return {}
    key = cache_key(machine(report), questions)
    path = cache_dir / "calibration" / f"{key}.json"
    if mode != "force" and path.is_file():
        log.info("calibration: reusing %s (key %s), no timing", path, key)
        return _verdicts(questions, json.loads(path.read_text()), path)
    if mode == "cached":
        return {}
    cpus = machine(report)["compute_cpus"]
    names = ", ".join(f"{q.decision} ({len(q.candidates)} candidates)" for q in questions)
    log.info("calibration: timing %s on CPUs %s, %d rounds", names, cpus, ROUNDS)
    started = time.monotonic()
    stored = _time(report, questions, cpus)
    stored |= {
        "key": key,
        "cpus": cpus,
        "seconds": round(time.monotonic() - started, 1),
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    replace_file(path, json.dumps(stored, indent=1).encode())  # no half-written result for the next start to read
    log.info(
        "calibration: done in %.1f s (read bandwidth %s GB/s before/after), stored in %s",
        stored["seconds"],
        stored["bandwidth_gb_s"],
        path,
    )
    return _verdicts(questions, stored, path)
