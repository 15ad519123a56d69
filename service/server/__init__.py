"""The HTTP shell around vLLM's own OpenAI serving layer."""
