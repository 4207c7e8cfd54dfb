"""Recommender models: popularity, SASRec, HSTU, generative retrieval; the registry builds, saves and loads them."""
