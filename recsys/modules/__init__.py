"""Reusable nn.Modules: transformer blocks, semantic-ID prefix embeddings, torchrec-compatible embedding bags."""
