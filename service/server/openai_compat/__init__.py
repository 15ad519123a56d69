"""What makes the engine's answers OpenAI's (and Anthropic's): request checks before vLLM sees a request, one error
shape for every refusal, and the response models."""
