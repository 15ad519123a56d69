"""Linear kernels the service hands to vLLM where vLLM has none fast enough (or none at all) on this CPU; the
policy (service/policy/quant_kernels.py KERNELS, those with a provider) decides where each runs."""
