"""The service's cache dir: whether it may be written, and the atomic writes and builds everything in it goes through."""
