"""Denoising programs in the candidates' form: each file defines `magic_denoise(X, **kwargs)` and
runs as it is in the sandbox (the problem reads their source); the benchmarks also import them."""
