"""The real agent clients, Claude Code and Codex CLI, as pinned in mk/agents.mk and installed by `make agent-clients`
into the repo's cache: where they are, their versions, and one non-interactive run of each with nothing set but the
service's address, key and model (and telemetry off: there is no network to send it to)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from harness import REPO

BIN = REPO / ".cache" / "agent-clients" / "node_modules" / ".bin"
# Scratch homes under the repo: Codex refuses a CODEX_HOME under /tmp for its helper binaries, and pytest's tmp_path
# is under /tmp in one of `make test`'s streams.
HOMES = REPO / ".cache" / "agent-homes"
QUIET = {"DISABLE_TELEMETRY": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}
RUN_TIMEOUT_S = 300


def install() -> dict[str, Path]:
    """The pinned clients, installed first if they are not (a no-op once they are): {"claude": ..., "codex": ...}."""
    subprocess.run(["make", "--no-print-directory", "agent-clients"], cwd=REPO, check=True, capture_output=True)
    return {name: BIN / name for name in ("claude", "codex")}


def version(binary: Path) -> str:
    return subprocess.run([binary, "--version"], capture_output=True, text=True, check=True).stdout.strip()


@dataclass(frozen=True)
class Scratch:
    home: Path  # the client's HOME (Codex's CODEX_HOME inside it)
    work: Path  # its working folder


@contextmanager
def scratch() -> Iterator[Scratch]:
    """An empty HOME under the repo's cache and an empty working folder outside the repo (inside it, Claude Code's
    prompt would carry the checkout's git status), both removed afterwards."""
    home = HOMES / uuid.uuid4().hex[:12]
    home.mkdir(parents=True)
    try:
        with tempfile.TemporaryDirectory(prefix="agent-work-") as work:
            yield Scratch(home, Path(work))
    finally:
        shutil.rmtree(home, ignore_errors=True)


def client_env(home: Path, variables: dict[str, str]) -> dict[str, str]:
    """Only PATH from this process: no ANTHROPIC_*, OPENAI_* or proxy variable of the caller's reaches the client."""
    return {"PATH": os.environ["PATH"], "HOME": str(home), "LANG": "C.UTF-8", **variables}


@dataclass
class Finished:
    argv: list[str]
    returncode: int | None  # None: still running at the deadline, and stopped there
    stdout: str
    stderr: str


def run(argv: list[str], where: Scratch, variables: dict[str, str], timeout: float = RUN_TIMEOUT_S) -> Finished:
    """`argv` in the working folder with `client_env`, stdin closed; at the deadline its whole process group is killed
    (Codex's npm launcher runs the real binary as a child)."""
    process = subprocess.Popen(
        argv,
        cwd=where.work,
        env=client_env(where.home, variables),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
        return Finished(argv, process.returncode, stdout, stderr)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        return Finished(argv, None, stdout, stderr)


@dataclass
class ClaudeRun:
    finished: Finished

    @property
    def result(self) -> dict | None:
        """The JSON of --output-format json; None when stdout is not that."""
        try:
            result = json.loads(self.finished.stdout)
        except ValueError:
            return None
        return result if isinstance(result, dict) else None

    def summary(self) -> str:
        f = self.finished
        return f"{' '.join(f.argv)} -> exit {f.returncode}\nstdout: {f.stdout[-3000:]}\nstderr: {f.stderr[-3000:]}"


def claude_env(base_url: str, key: str, model: str | None) -> dict[str, str]:
    """Claude Code pointed at the service: the key as its Bearer token; without `model` it names its own models."""
    return {"ANTHROPIC_BASE_URL": base_url, "ANTHROPIC_AUTH_TOKEN": key, **QUIET} | (
        {"ANTHROPIC_MODEL": model} if model else {}
    )


def claude_argv(binary: Path, prompt: str, *, resume: bool = False) -> list[str]:
    """`claude -p PROMPT --output-format json` (with --continue: the last session of the same working folder)."""
    return [str(binary), "-p", *(["--continue"] if resume else []), prompt, "--output-format", "json"]


@dataclass
class CodexRun:
    finished: Finished

    @property
    def events(self) -> list[dict]:
        """The JSON lines of --json."""
        events = []
        for line in self.finished.stdout.splitlines():
            try:
                events.append(json.loads(line))
            except ValueError:
                continue
        return events

    @property
    def messages(self) -> list[str]:
        return [
            e["item"]["text"]
            for e in self.events
            if e.get("type") == "item.completed" and e.get("item", {}).get("type") == "agent_message"
        ]

    @property
    def failures(self) -> list[dict]:
        return [e for e in self.events if e.get("type") in ("error", "turn.failed")]

    def summary(self) -> str:
        f = self.finished
        return f"{' '.join(f.argv)} -> exit {f.returncode}\nevents:\n{f.stdout[-3000:]}\nstderr: {f.stderr[-3000:]}"


PROVIDER = "cpu-llm-service"
KEY_VARIABLE = "SERVICE_API_KEY"


def codex_config(base_url: str, model: str) -> str:
    """The least config.toml that points Codex at the service: one provider speaking the Responses API."""
    return (
        f'model = "{model}"\nmodel_provider = "{PROVIDER}"\n\n[model_providers.{PROVIDER}]\nname = "{PROVIDER}"\n'
        f'base_url = "{base_url}/v1"\nwire_api = "responses"\nenv_key = "{KEY_VARIABLE}"\n'
    )


def run_codex(
    binary: Path, where: Scratch, config: str, key: str, prompt: str, timeout: float = RUN_TIMEOUT_S
) -> CodexRun:
    """`codex exec --skip-git-repo-check --json PROMPT` with CODEX_HOME = HOME/codex holding `config`."""
    codex_home = where.home / "codex"
    codex_home.mkdir(exist_ok=True)
    (codex_home / "config.toml").write_text(config)
    argv = [str(binary), "exec", "--skip-git-repo-check", "--json", prompt]
    return CodexRun(run(argv, where, {"CODEX_HOME": str(codex_home), KEY_VARIABLE: key}, timeout))
