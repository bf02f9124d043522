"""Knowledge of quantized safetensors layouts (which tensors hold what, how values decode)."""
