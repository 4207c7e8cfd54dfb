"""FBGEMM backends of the ops (`Kernel.FBGEMM`): thin wrappers over `torch.ops.fbgemm.*`, loaded only on request."""
