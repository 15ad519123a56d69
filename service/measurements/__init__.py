"""The measurement store: every figure a decision rests on, one YAML row each with its command, machine and date
(store.py reads them)."""
