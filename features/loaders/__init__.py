"""Loaders: each reads one raw format and returns a `features.raw.RawDataset` in the canonical schema."""

from features.loaders.amazon_p5 import load_amazon_p5, load_amazon_p5_domains
from features.loaders.amazon_raw import load_amazon_raw
from features.loaders.movielens import load_movielens

__all__ = ["load_amazon_p5", "load_amazon_p5_domains", "load_amazon_raw", "load_movielens"]
