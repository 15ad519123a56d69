"""Paths out of what anyone may read: /metrics (open unless metrics_require_auth), /health and /ready (open to
probes). A decision's value or a failed start's reason names cache, model and adapter paths and cgroup files,
which tell an unauthenticated reader the layout of the machine; the name at the end of a path is kept, which is
what tells the reader which thing it is."""

from __future__ import annotations

import re

# An absolute path (or ~/...): its directories go, its last part stays. "/srv/cache/models/gguf/ab12-float32"
# -> "ab12-float32"; "sql=/srv/adapters/sql" -> "sql=sql".
# A path list ("a.so:/b/c.so") loses each one's directories; a URL ("http://host/a/b") keeps its own.
_DIRECTORIES = re.compile(r"(?<![\w./])~?/(?!/)(?:[^\s/'\"(),;=:]+/)+")


def without_paths(text: str) -> str:
    return _DIRECTORIES.sub("", text)
