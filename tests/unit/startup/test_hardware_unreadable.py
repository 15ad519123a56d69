"""A cgroup or sysfs file that does not parse refuses the start with one line naming the file, as `detect` does
(was: a traceback). The recorded tree goes through the reader the live start uses."""

from __future__ import annotations

import logging
import shutil

from service import startup
from service.facts.hardware import read_hardware
from service.server.run import run
from service.server.supervision.lifecycle import EXIT_STARTUP_REFUSED
from service.settings import Settings
from tests.support.server import MODELS
from tests.unit.conftest import SYSFS


def test_a_cgroup_file_that_does_not_parse_refuses_the_start(tmp_path, monkeypatch, caplog):
    tree = shutil.copytree(SYSFS / "container_cpuset", tmp_path / "machine")  # with the file proc/cpuinfo links to
    cpu_max = tree / "sys" / "fs" / "cgroup" / "cpu.max"
    cpu_max.write_text("abc 100000\n")
    monkeypatch.setattr(startup, "read_hardware", lambda cpuinfo, sysfs: read_hardware(sysfs_root=tree / "sys"))
    settings = Settings(model="demo-tiny-llama", cache_dir=MODELS, build_kernels="off", calibrate="off")
    with caplog.at_level(logging.ERROR, logger="service"):
        assert run(settings) == EXIT_STARTUP_REFUSED
    assert (
        f"refusing to start: cannot read the hardware facts: {cpu_max} holds 'abc', not a whole number" in caplog.text
    )
