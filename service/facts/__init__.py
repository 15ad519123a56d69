"""What is true about the machine and the model: read-only, pure readers that take a root path."""
