"""What runs the linear layers: quantized kernels, the dense kernel, ggml's hand-over to the GEMM."""
