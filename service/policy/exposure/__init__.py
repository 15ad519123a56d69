"""What the port and the engine expose: access, usage statistics, remote media."""
