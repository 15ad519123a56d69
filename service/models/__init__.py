"""Where the engine's weights come from: the demo model, GGUF conversion, the hub and the Ollama store."""
