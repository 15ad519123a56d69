"""The parts of `make bench`: one module each, listed in bench/registry.py (some also run alone: `python -m
bench.parts.<name>`)."""
