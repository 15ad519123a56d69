"""GGUF files: the architectures checked, the conversion's config and rope, the model source."""
