"""RQ-VAE (Zeghidour et al. 2021; as the semantic-ID tokenizer of TIGER, Rajput et al. 2023).

An MLP encoder maps an item embedding to a small latent z; L residual codebooks quantize it greedily
(code l = the nearest codeword to what levels 1..l-1 left over); an MLP decoder reconstructs the item
embedding from the sum of the chosen codewords. Training:

- loss = ||x - x_hat||^2 + sum over levels of ||sg[r_l] - e_l||^2 (codebook) + beta ||r_l - sg[e_l]||^2
  (commitment), each summed over the feature dimension and averaged over the batch;
- the straight-through estimator carries the decoder's gradient past the quantizer to the encoder;
- each codebook is initialised by k-means on the first batch's residuals at its level;
- every `dead_code_every` steps, codes no item of the last `dead_code_every` batches chose are re-seeded
  from random residuals of the current batch (and their Adam moments reset).

Training is deterministic by `seed` on CPU (same thread count).

Dimension letters: B batch, N items, D embedding dim, d latent dim, L levels, K codes per level.
"""

from __future__ import annotations

import itertools
import logging
import time
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from recsys.errors import ConfigError, DataError
from recsys.runtime.device import resolve_device

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RQVAEConfig:
    levels: int = 3  # L, as TIGER
    codebook_size: int = 256  # K codes per level
    latent_dim: int = 32  # d, as TIGER
    hidden_dims: tuple[int, ...] = (512, 256, 128)  # encoder widths; the decoder mirrors them
    beta: float = 0.25  # commitment weight
    lr: float = 1e-3
    weight_decay: float = 0.0
    steps: int = 3000
    batch_size: int = 1024  # 0 = full batch
    dead_code_every: int = 100  # restart codes unused over this many steps; 0 = never
    kmeans_iters: int = 20  # Lloyd iterations of the first-batch codebook initialisation
    seed: int = 0
    progress: bool = True  # tqdm bar (shown on terminals only)

    def __post_init__(self) -> None:
        if self.levels < 1 or self.codebook_size < 2 or self.latent_dim < 1 or self.steps < 1:
            raise ConfigError(
                f"RQVAEConfig needs levels >= 1, codebook_size >= 2, latent_dim >= 1, steps >= 1; got {self}. "
                "Fix: e.g. levels=3, codebook_size=256, latent_dim=32, steps=3000"
            )
        if self.batch_size < 0 or self.dead_code_every < 0:
            raise ConfigError(f"RQVAEConfig.batch_size and dead_code_every must be >= 0; got {self}")


def _mlp(dims: list[int]) -> nn.Sequential:
    """Linear layers with ReLU between them (none after the last)."""
    layers: list[nn.Module] = []
    for i, (d_in, d_out) in enumerate(itertools.pairwise(dims)):
        layers.append(nn.Linear(d_in, d_out))
        if i < len(dims) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


@dataclass(frozen=True)
class Quantized:
    """Output of `ResidualQuantizer`.

    Args:
        z_q: (B, d) the sum of the chosen codewords, with the straight-through gradient to z.
        codes: (B, L) int64.
        loss: scalar codebook + commitment loss over the levels.
        residuals: (L, B, d) the residual each level quantized (detached).
    """

    z_q: torch.Tensor
    codes: torch.Tensor
    loss: torch.Tensor
    residuals: torch.Tensor


class ResidualQuantizer(nn.Module):
    """L codebooks of K codewords; level l quantizes the residual left by levels 1..l-1."""

    def __init__(self, levels: int, codebook_size: int, dim: int, beta: float) -> None:
        super().__init__()
        self.beta = beta
        self.codebooks = nn.Parameter(torch.randn(levels, codebook_size, dim) * 0.01)  # (L, K, d)

    def forward(self, z: torch.Tensor) -> Quantized:
        residual = z  # (B, d)
        z_q = torch.zeros_like(z)
        loss = z.new_zeros(())
        codes, residuals = [], []
        for codebook in self.codebooks:  # (K, d)
            r = residual.detach()
            code = torch.cdist(r, codebook.detach()).argmin(-1)  # (B,)
            e = codebook.index_select(0, code)  # (B, d); deterministic backward, unlike codebook[code] on CPU
            loss = loss + ((r - e) ** 2).sum(-1).mean() + self.beta * ((residual - e.detach()) ** 2).sum(-1).mean()
            z_q = z_q + e.detach()
            residual = residual - e.detach()
            codes.append(code)
            residuals.append(r)
        z_q = z + (z_q - z).detach()  # straight-through: forward = codewords, backward = identity to z
        return Quantized(z_q, torch.stack(codes, 1), loss, torch.stack(residuals))

    def lookup(self, codes: torch.Tensor) -> torch.Tensor:
        """(B, L) codes -> (B, d) the sum of their codewords."""
        levels = torch.arange(self.codebooks.shape[0], device=codes.device)
        return self.codebooks[levels, codes].sum(1)  # (B, L, d) -> (B, d)


class RQVAE(nn.Module):
    """Encoder -> residual quantizer -> decoder.

    Example:
        >>> model = RQVAE(16, RQVAEConfig(levels=2, codebook_size=8, latent_dim=4, hidden_dims=(12,)))
        >>> x_hat, q = model(torch.randn(5, 16))
        >>> x_hat.shape, q.codes.shape, model.semantic_ids(torch.randn(5, 16)).shape
        (torch.Size([5, 16]), torch.Size([5, 2]), torch.Size([5, 2]))
    """

    def __init__(self, input_dim: int, config: RQVAEConfig) -> None:
        super().__init__()
        self.config = config
        dims = [input_dim, *config.hidden_dims, config.latent_dim]
        self.encoder = _mlp(dims)  # D -> ... -> d
        self.decoder = _mlp(dims[::-1])  # d -> ... -> D
        self.quantizer = ResidualQuantizer(config.levels, config.codebook_size, config.latent_dim, config.beta)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, Quantized]:
        """(B, D) embeddings -> (B, D) reconstructions and the quantizer's output."""
        q = self.quantizer(self.encoder(x))
        return self.decoder(q.z_q), q

    @torch.no_grad()
    def semantic_ids(self, x: torch.Tensor) -> torch.Tensor:
        """(B, D) embeddings -> (B, L) int64 codes."""
        return self.quantizer(self.encoder(x)).codes

    @torch.no_grad()
    def decode_codes(self, codes: torch.Tensor) -> torch.Tensor:
        """(B, L) codes -> (B, D) reconstructed embeddings."""
        return self.decoder(self.quantizer.lookup(codes))


def train_rqvae(
    x: np.ndarray | torch.Tensor, config: RQVAEConfig = RQVAEConfig(), device: str | torch.device = "auto"
) -> tuple[RQVAE, np.ndarray]:
    """Train an RQ-VAE on item embeddings and return it with the items' codes.

    Args:
        x: (N, D) item embeddings, N >= K.
        config: architecture and training settings.
        device: "auto" (cuda when available), "cpu", "cuda", ...

    Returns:
        the trained model (eval mode, on `device`) and the codes of `x`, (N, L) int64.
    """
    device = resolve_device(device) if isinstance(device, str) else device
    data = _as_tensor(x).to(device)  # (N, D)
    N = len(data)
    if N < config.codebook_size:
        raise ConfigError(
            f"RQ-VAE: {N} items cannot fill a codebook of {config.codebook_size} codes. Fix: set codebook_size <= {N}"
        )
    batch_size = N if config.batch_size == 0 else min(config.batch_size, N)
    generator = torch.Generator().manual_seed(config.seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        model = RQVAE(data.shape[1], config).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    batches = _BatchIter(N, batch_size, generator)
    usage = torch.zeros(config.levels, config.codebook_size, dtype=torch.int64, device=device)  # (L, K)
    start = time.perf_counter()
    bar = tqdm(range(config.steps), desc="rq-vae", unit="step", leave=False, disable=None if config.progress else True)
    for step in bar:
        batch = data[next(batches).to(device)]  # (B, D)
        if step == 0:
            _kmeans_init(model, batch, config.kmeans_iters, generator)
        model.train()
        x_hat, q = model(batch)
        recon = ((batch - x_hat) ** 2).sum(-1).mean()
        loss = recon + q.loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        for level in range(config.levels):
            usage[level] += torch.bincount(q.codes[:, level], minlength=config.codebook_size)
        restart_due = config.dead_code_every and (step + 1) % config.dead_code_every == 0
        if restart_due and step + 1 < config.steps:
            _restart_dead_codes(model, optimizer, usage == 0, q.residuals, generator)
            usage.zero_()
        if step % 50 == 0 or step == config.steps - 1:
            bar.set_postfix(recon=f"{recon.item():.4f}", rq=f"{q.loss.item():.4f}")
    model.eval()
    codes = torch.cat([model.semantic_ids(chunk) for chunk in data.split(8192)]).cpu().numpy()
    logger.info(
        "RQ-VAE trained in %.1f s (%d steps of %d items, %s): recon %.4f, rq %.4f",
        time.perf_counter() - start,
        config.steps,
        batch_size,
        device,
        recon.item(),
        q.loss.item(),
    )
    return model, codes


class _BatchIter:
    """Endless mini-batches of row indices: a fresh random permutation per pass over the data."""

    def __init__(self, N: int, batch_size: int, generator: torch.Generator) -> None:
        self.N, self.batch_size, self.generator = N, batch_size, generator
        self.perm = torch.randperm(N, generator=generator)
        self.pos = 0

    def __iter__(self) -> _BatchIter:
        return self

    def __next__(self) -> torch.Tensor:
        if self.pos + self.batch_size > self.N:
            self.perm, self.pos = torch.randperm(self.N, generator=self.generator), 0
        self.pos += self.batch_size
        return self.perm[self.pos - self.batch_size : self.pos]


@torch.no_grad()
def _kmeans_init(model: RQVAE, batch: torch.Tensor, iters: int, generator: torch.Generator) -> None:
    """Set each codebook to k-means centroids of the batch's residuals at its level."""
    residual = model.encoder(batch)  # (B, d)
    for codebook in model.quantizer.codebooks:  # (K, d)
        codebook.copy_(_kmeans(residual, codebook.shape[0], iters, generator))
        residual = residual - codebook[torch.cdist(residual, codebook).argmin(-1)]


def _kmeans(x: torch.Tensor, k: int, iters: int, generator: torch.Generator) -> torch.Tensor:
    """Lloyd's k-means of (B, d) points from k random distinct points; an empty cluster keeps its centroid."""
    centroids = x[torch.randperm(len(x), generator=generator)[:k].to(x.device)].clone()  # (K, d)
    for _ in range(iters):
        assign = torch.cdist(x, centroids).argmin(-1)  # (B,)
        sums = torch.zeros_like(centroids).index_add_(0, assign, x)
        counts = torch.bincount(assign, minlength=k).to(x.dtype)[:, None]  # (K, 1)
        centroids = torch.where(counts > 0, sums / counts.clamp_min(1), centroids)
    return centroids


@torch.no_grad()
def _restart_dead_codes(
    model: RQVAE,
    optimizer: torch.optim.Optimizer,
    dead: torch.Tensor,
    residuals: torch.Tensor,
    generator: torch.Generator,
) -> None:
    """Re-seed dead codes (dead: (L, K) bool) from random residuals ((L, B, d)) of their level."""
    codebooks = model.quantizer.codebooks
    state = optimizer.state.get(codebooks, {})
    for level in range(dead.shape[0]):
        rows = dead[level].nonzero().flatten()
        if len(rows) == 0:
            continue
        pick = torch.randint(residuals.shape[1], (len(rows),), generator=generator).to(rows.device)
        codebooks[level, rows] = residuals[level, pick]
        for moment in ("exp_avg", "exp_avg_sq"):
            if moment in state:
                state[moment][level, rows] = 0.0
        logger.debug("RQ-VAE: restarted %d dead codes of level %d", len(rows), level + 1)


def _as_tensor(x: np.ndarray | torch.Tensor) -> torch.Tensor:
    t = torch.as_tensor(x, dtype=torch.float32)
    if t.ndim != 2 or len(t) == 0:
        raise DataError("embeddings", f"shape {tuple(t.shape)} is not (N, D) with N >= 1", "pass one row per item")
    if not bool(torch.isfinite(t).all()):
        bad = int((~torch.isfinite(t).all(1)).nonzero()[0, 0])
        raise DataError("embeddings", f"row {bad} holds NaN or inf", "re-compute the embeddings of that item")
    return t
