from __future__ import annotations

import numpy as np
import pytest

from recsys.errors import ConfigError, DataError
from recsys.semantic_ids import RQKMeansConfig, fit_rqkmeans, semantic_id_stats


def clustered(n: int = 1200, dim: int = 16, clusters: int = 8, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(clusters, dim)) * 3
    return (centers[rng.integers(clusters, size=n)] + rng.normal(size=(n, dim))).astype(np.float32)


def test_reconstruction_error_decreases_with_levels() -> None:
    x = clustered()
    errors = []
    for levels in (1, 2, 3):
        model, codes = fit_rqkmeans(x, RQKMeansConfig(levels=levels, codebook_size=16))
        stats = semantic_id_stats(codes, 16, x, model.decode(codes))
        assert stats.recon_relative is not None
        errors.append(stats.recon_relative)
    assert errors[0] > errors[1] > errors[2]
    assert errors[0] < 0.5  # 16 centroids over 8 clear clusters explain most of the variance


def test_codes_are_the_greedy_nearest_centroids_and_decode_sums_them() -> None:
    x = clustered(n=500)
    model, codes = fit_rqkmeans(x, RQKMeansConfig(levels=2, codebook_size=8))
    assert codes.shape == (500, 2) and codes.dtype == np.int64
    assert model.codebooks.shape == (2, 8, 16)
    np.testing.assert_array_equal(model.encode(x), codes)
    expected = model.codebooks[0][codes[:, 0]] + model.codebooks[1][codes[:, 1]]
    np.testing.assert_allclose(model.decode(codes), expected, rtol=1e-6)


def test_fits_are_deterministic_by_seed() -> None:
    x = clustered(n=600)
    _, a = fit_rqkmeans(x, RQKMeansConfig(levels=2, codebook_size=16, seed=3))
    _, b = fit_rqkmeans(x, RQKMeansConfig(levels=2, codebook_size=16, seed=3))
    _, c = fit_rqkmeans(x, RQKMeansConfig(levels=2, codebook_size=16, seed=4))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_bad_inputs_name_the_problem() -> None:
    with pytest.raises(ConfigError, match="codebook_size <= 10"):
        fit_rqkmeans(clustered(n=10), RQKMeansConfig(codebook_size=16))
    x = clustered(n=100)
    x[7, 3] = np.nan
    with pytest.raises(DataError, match="row 7"):
        fit_rqkmeans(x, RQKMeansConfig(codebook_size=4))
    with pytest.raises(ConfigError, match="levels"):
        RQKMeansConfig(levels=0)
