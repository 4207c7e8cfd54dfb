"""Recommender models: popularity, SASRec, HSTU, two-tower, generative retrieval, fusion, the two-stage ranker and
domain adapters; the registry builds, saves and loads them."""

from typing import Literal

# How a model family trains (`recsys.training.recipes`): by gradient on next items (with text queries of the targets:
# "query_aware"), or on (history, next item) pairs for the generative, two-tower and ranker models; "counts": from item
# counts; "frozen": not at all (it is made of trained models). Each model class names its own (`training_family`).
TrainingFamily = Literal["next_item", "query_aware", "generative", "two_tower", "ranker", "counts", "frozen"]
