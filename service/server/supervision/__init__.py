"""The engine's life under the server: its start, whether a start still progresses, whether the engine still
answers, its death and the drain."""
