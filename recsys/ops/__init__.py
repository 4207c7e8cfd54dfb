"""Kernels: one dispatcher module per op (`Kernel.TORCH | TRITON | FBGEMM`), a plain-PyTorch fp32 reference beside each.

Import from the op's module (`from recsys.ops.embedding_bag import embedding_bag`): re-exporting the
function here would shadow the module of the same name. Importing this package never imports Triton;
the Triton kernels load on first use.
"""
