"""Benchmarks (``megakernel.bench``): decode latency of every backend, side by side."""
