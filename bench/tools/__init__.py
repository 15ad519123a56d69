"""Measurements beside `make bench`, each run on its own (`python -m bench.tools.<name>`), and the tools that carry a
run's results into the store and the docs (promote, docs)."""
