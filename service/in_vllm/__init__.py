"""What runs inside vLLM's own processes (API server, engine core, workers), loaded through vLLM's plugin entry
points: each module applies a decision the policy took at startup; none decides again."""
