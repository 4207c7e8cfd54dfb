"""Recommender models, one family per module (popularity, SASRec, HSTU, the query-aware model, two-tower, generative
retrieval, the two-stage ranker, domain adapters, fusion), each ending in its spec (`FAMILY`,
`recsys.models.family.ModelFamily`); the registry collects the specs and builds, saves and loads the models."""
