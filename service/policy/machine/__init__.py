"""The machine: the backend, vLLM's platform, thread binding, the CPUs of a model table, the preload."""
