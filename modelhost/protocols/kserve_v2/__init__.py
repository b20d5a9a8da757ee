"""KServe V2 / Open Inference Protocol with Triton's extensions."""
