"""Benchmarks of the kernels (recsys/ops) and of a training step that uses them."""
