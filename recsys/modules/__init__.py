"""Reusable nn.Modules (transformer blocks)."""
