"""CPU LLM inference service."""
