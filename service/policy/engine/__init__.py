"""The engine's settings for a model: dtype, context, caching, KV cache, memory, chat parsers, sampling, speculation, LoRA."""
