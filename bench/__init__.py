"""The benchmark, a tool beside the service (`python -m bench`, `make bench`; docs/benchmarks.md): our front end against
vLLM's own server, the policy against vLLM's defaults, batch-1 decode against the bandwidth ceiling, and llama.cpp's
server as the peer users would pick instead. Servers run through harness/; what they decided is read over HTTP."""
