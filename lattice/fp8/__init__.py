"""FP8 where it is safe: LoKA-style probe (running statistics per GEMM site), offline error
estimate per recipe, static dispatch to FP8 GEMMs, and the serving form of FP8 sites."""
