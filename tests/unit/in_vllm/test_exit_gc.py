"""A process that skips the collection at exit still runs its exit handlers; objects it left in reference cycles
are not collected (their finalizers are how the test sees the collection)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import atexit, gc, os, sys

    gc.disable()  # no collection before exit: only the one at exit could reach the cycle
    if sys.argv[2] == "skip":
        from service.in_vllm.exit_gc import skip_exit_collection
        skip_exit_collection()
    atexit.register(lambda: print("exit handler ran", flush=True))

    class Cycle:
        def __init__(self):
            self.me, self.write = self, os.write

        def __del__(self):
            self.write(1, b"collected at exit\\n")

    Cycle()
    """
)


@pytest.mark.parametrize("mode", ["skip", "default"])
def test_the_exit_collection_is_skipped_and_exit_handlers_still_run(mode):
    out = subprocess.run([sys.executable, "-c", SCRIPT, "", mode], capture_output=True, text=True, check=True).stdout
    assert "exit handler ran" in out
    assert ("collected at exit" in out) == (mode == "default"), out
