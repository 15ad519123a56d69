"""The service's own process and the preload (service/startup/self_preload.py): the user's LD_PRELOAD survives the
re-exec, and what is loaded is read from a maps text like /proc/self/maps."""

from __future__ import annotations

import os
from pathlib import Path

from service.startup.self_preload import (
    REEXEC_ENV,
    mapped_files,
    missing_from,
    reexec_argv,
    reexec_environ,
    restore_user_preload,
)

MAPS = """\
7f0000000000-7f0000001000 r--p 00000000 fd:01 123 /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4.5.10
7f0000001000-7f0000002000 r-xp 00001000 fd:01 123 /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4.5.10
7f0000003000-7f0000004000 rw-p 00000000 00:00 0
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0 [stack]
7f0000005000-7f0000006000 r--p 00000000 fd:01 456 /opt/venv/lib/lib with space.so
"""


def test_mapped_files_are_the_path_column_spaces_included():
    assert mapped_files(MAPS) == {
        "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4.5.10",
        "[stack]",
        "/opt/venv/lib/lib with space.so",
    }


def test_a_library_counts_as_loaded_through_its_symlink(tmp_path: Path):
    real = tmp_path / "libtcmalloc_minimal.so.4.5.10"
    real.write_bytes(b"")
    link = tmp_path / "libtcmalloc_minimal.so.4"
    link.symlink_to(real.name)
    other = tmp_path / "libiomp5.so"
    assert missing_from(f"{link}:{other}", {str(real)}) == [str(other)]
    assert missing_from(str(link), {str(real)}) == []
    assert missing_from(None, set()) == [] and missing_from("", set()) == []


def test_the_user_preload_travels_beside_the_decided_one_and_comes_back():
    decided = "/lib/libtcmalloc_minimal.so.4:/venv/lib/libiomp5.so"
    for user in (None, "/opt/mine.so"):
        started = {"PATH": "/bin", **({"LD_PRELOAD": user} if user else {})}
        assert not restore_user_preload(dict(started)), "a first start is not a re-exec"
        env = reexec_environ({**started, "LD_PRELOAD": decided}, user)
        assert env["LD_PRELOAD"] == decided and env["PATH"] == "/bin"
        assert restore_user_preload(env)
        assert env == started, "the policy then decides from what the user set"


def test_reexec_runs_the_same_command_through_the_same_interpreter():
    argv = ["/repo/service/__main__.py", "serve", "--port", "9000"]
    assert reexec_argv("/venv/bin/python", argv) == ["/venv/bin/python", "-m", "service", "serve", "--port", "9000"]
    assert REEXEC_ENV.startswith("SERVICE_") and REEXEC_ENV not in os.environ
