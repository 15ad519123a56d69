"""The HTTP layer: the FastAPI app, its routes, who may call them (auth, hosts, body size), request ids, metrics,
and the port's answers while a model downloads."""
