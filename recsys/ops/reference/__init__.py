"""Plain-PyTorch references of the ops, computed in fp32: the ground truth the tests compare backends with."""
