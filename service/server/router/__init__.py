"""Several models in one service (the `models` table): a front end that routes each request by its `model` to the
engine of that model, each engine a `python -m service serve` child of its own (its plan, its supervision), loaded on
demand and stopped under the memory plan."""
