"""Loaders: each reads one raw format and returns a `features.raw.RawDataset` in the canonical schema (or, for
formats read batch by batch, a `features.raw.RawStream`)."""

from features.loaders.amazon_p5 import load_amazon_p5, load_amazon_p5_domains, open_amazon_p5
from features.loaders.amazon_raw import load_amazon_raw
from features.loaders.movielens import load_movielens

__all__ = ["load_amazon_p5", "load_amazon_p5_domains", "load_amazon_raw", "load_movielens", "open_amazon_p5"]
