"""Recommender models: popularity, SASRec, generative retrieval; the registry builds, saves and loads them."""
