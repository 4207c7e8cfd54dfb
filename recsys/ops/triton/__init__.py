"""Triton kernels of the ops. Import the op modules (which import `triton`) only where a kernel runs."""
