"""What every vLLM process applies (service/in_vllm carries it out): AMX tile state, version patches, the compile cache."""
