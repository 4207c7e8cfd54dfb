"""Fixtures shared by every test folder: small raw files, a tiny prepared synthetic dataset, a tiny experiment, the
popularity bar, a registered champion (one pipeline run into a real MLflow SQLite registry) and `recsys serve` of it.

Without CUDA, the Triton kernels run in Triton's interpreter: Triton reads TRITON_INTERPRET when it is imported and
when it decorates the kernels, hence here, at collection time, before any test imports `triton` or `recsys.ops.triton`
(so this file's own imports stay clear of the kernels).
"""

from __future__ import annotations

import gzip
import importlib.util
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import torch
import yaml

from features.prepare import prepare
from features.sources import load_source
from pipelines.launcher import THREAD_VARIABLES, threads_each
from recsys.data.prepared import SequenceData
from recsys.evaluation import EvalConfig, evaluate
from recsys.models.generative import GenerativeConfig, GenerativeRetriever
from recsys.models.popularity import Popularity, PopularityConfig
from recsys.training.config import OptimizationConfig, ScheduleConfig, TrainConfig
from tests.chat_server import chat_server  # noqa: F401 (a fixture: an OpenAI-compatible server for the enrich tests)

if TYPE_CHECKING:
    from pipelines.config import ExperimentConfig
    from pipelines.train import TrainOutputs

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def _share_the_cores_among_test_processes() -> None:
    """Under pytest-xdist each test process takes its share of the cores (torch's pool here, and through
    `THREAD_VARIABLES` the processes a test starts), as the launcher gives training processes theirs: N processes
    each spinning one thread per core slow each other down many times over. A count the user set is kept."""
    processes = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if processes > 1:
        for name in THREAD_VARIABLES:
            os.environ.setdefault(name, str(threads_each(processes)))
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


_share_the_cores_among_test_processes()

TINY_SYNTHETIC = {"num_users": 300, "num_items": 150}

# Three users with >= 3 items each, plus items.csv with a quoted comma in a title.
P5_SEQUENCES = "u1 a b c d\nu2 b c e\nu3 a c e f\n"
P5_ITEMS = 'item_id,title\na,Alpha\nb,"Bravo, the sequel"\nc,Charlie\nd,Delta\ne,Echo\nf,Foxtrot\n'


@pytest.fixture(autouse=True, scope="session")
def one_hstu_attention_config() -> Iterator[dict[Any, list[Any]]]:
    """On a GPU each HSTU attention kernel autotunes over 16 configs per shape class and dtype (48 compiles a case:
    minutes a test module). Tests check outputs, not the tuner's pick: they run the 64 x 64 blocks config (plain
    loads), and
    test_every_autotune_config_gives_the_reference runs every one (this fixture's value: each autotuned kernel's
    whole config list). The interpreter has one config anyway (the value is then empty)."""
    if not torch.cuda.is_available() or importlib.util.find_spec("triton") is None:
        yield {}
        return
    from recsys.ops.triton.hstu_attention import AUTOTUNED_KERNELS

    every = {tuner: tuner.configs for tuner in AUTOTUNED_KERNELS}
    for tuner, configs in every.items():
        tuner.configs = [
            c for c in configs if (c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"]) == (64, 64) and not c.kwargs.get("TMA")
        ]
    yield every
    for tuner, configs in every.items():
        tuner.configs = configs


@pytest.fixture(scope="session")
def tiny_data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A prepared directory of a small synthetic dataset (shared, read-only for the tests)."""
    out = tmp_path_factory.mktemp("tiny") / "prepared"
    prepare(load_source("synthetic", None, seed=0, **TINY_SYNTHETIC), out)
    return out


def quick_train(epochs: int, batch_size: int, lr: float = 3e-3) -> TrainConfig:
    """The settings of a short training run in a test: its epochs, batch size and learning rate, no progress bars."""
    return TrainConfig(
        schedule=ScheduleConfig(epochs=epochs),
        optimization=OptimizationConfig(batch_size=batch_size, lr=lr),
        progress=False,
    )


def write_tiny_config(tmp_path: Path, **sections: dict) -> Path:
    """Write a fast SASRec experiment YAML on the tiny synthetic data; `sections` override keys."""
    config = {
        "name": "tiny-sasrec",
        "data": {"source": "synthetic", "options": dict(TINY_SYNTHETIC)},
        "model": {"name": "sasrec", "params": {"max_history": 20, "dim": 32, "num_heads": 1, "ffn_dim": 64}},
        "train": {"schedule": {"epochs": 3, "patience": 2}, "optimization": {"batch_size": 8}, "progress": False},
        "content": {"text_fields": ["title"]},  # embedded only for the models (and semantic IDs) that read it
        "tracking": {"uri": f"sqlite:///{tmp_path / 'mlflow.db'}"},
    }
    for key, value in sections.items():
        if key == "train":  # its groups merge too: train={"schedule": {"epochs": 1}} keeps the batch size
            value = {
                **value,
                **{g: {**config["train"][g], **value[g]} for g in value if g in ("schedule", "optimization")},
            }
        config[key] = {**config.get(key, {}), **value} if isinstance(value, dict) else value
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture(scope="session")
def tiny_config() -> Callable[..., Path]:
    """`tiny_config(dir, train={"schedule": {"epochs": 2}})` writes a fast experiment YAML into dir and returns its
    path."""
    return write_tiny_config


def check_frozen_config(path: Path) -> None:
    """An experiment config of <dataset>/<stem>.yaml under a `configs` folder loads, is named `<dataset>-<stem>`,
    and is headed by its purpose, date and command."""
    from pipelines.config import load_config  # the pipeline imports the Triton kernels: after TRITON_INTERPRET

    config = load_config(path)
    assert config.name == f"{path.parent.name}-{path.stem}"  # configs/<dataset>/<stem>.yaml
    header = path.read_text().splitlines()[:8]
    for field in ("# Purpose:", "# Date:", "# Command:"):
        assert any(line.startswith(field) for line in header), f"{path.name} lacks '{field}'"


def train_experiment(config: ExperimentConfig, work: Path) -> TrainOutputs:
    """The pipeline of `config` until its train step, under `work`: the trained model's outputs."""
    from pipelines.runner import run_pipeline  # the pipeline imports the Triton kernels: after TRITON_INTERPRET

    outputs, _ = run_pipeline(config, work, until="train_retriever")
    assert outputs.model is not None
    return outputs.model


def compiled_recording_graphs(fn: Callable[..., Any]) -> tuple[Callable[..., Any], list[str]]:
    """`fn` under torch.compile with fullgraph=True (a graph break raises), run by aot_eager (through the custom
    ops' fake implementations and the autograd.Functions around them, no compiler), and the code of the graphs it
    captures (each with its subgraphs: an autograd.Function's forward and backward bodies)."""
    graphs: list[str] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Any:
        graphs.append("\n".join(m.code for m in gm.modules() if isinstance(m, torch.fx.GraphModule)))
        return torch._dynamo.lookup_backend("aot_eager")(gm, example_inputs)

    return torch.compile(fn, backend=backend, fullgraph=True), graphs


def popularity_valid_metric(data: SequenceData, eval_config: EvalConfig, metric: str = "ndcg@10") -> float:
    """`metric` of the most-popular baseline on `data`'s validation split: the bar a trained model must clear."""
    popularity = Popularity(PopularityConfig(data.num_items))
    popularity.fit(data.item_counts())
    return evaluate(popularity, data.eval_split("valid"), data.num_items, eval_config).metrics[metric]


@pytest.fixture
def write(tmp_path: Path) -> Callable[..., Path]:
    """Write `content` (str or bytes) to tmp_path/name, gzipped when `gz=True`; return the path."""

    def _write(name: str, content: str | bytes, *, gz: bool = False) -> Path:
        data = content.encode("utf-8") if isinstance(content, str) else content
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(gzip.compress(data, mtime=0) if gz else data)
        return path

    return _write


@pytest.fixture
def p5_dir(write: Callable[..., Path], tmp_path: Path) -> Path:
    """A small P5-form directory with user_sequence.txt and items.csv."""
    write("amazon-toys/user_sequence.txt", P5_SEQUENCES)
    write("amazon-toys/items.csv", P5_ITEMS)
    return tmp_path / "amazon-toys"


@pytest.fixture(scope="session")
def registry(tmp_path_factory: pytest.TempPathFactory, tiny_config: Callable[..., Path]) -> tuple[str, str, Path]:
    """(tracking URI, registered model name, data dir) after one pipeline run (champion = version 1)."""
    work = tmp_path_factory.mktemp("serving")
    from pipelines.config import load_config  # the pipeline imports the Triton kernels: after TRITON_INTERPRET
    from pipelines.runner import run_pipeline

    config = load_config(tiny_config(work, pipeline={"index": {"kind": "flat"}}))
    outputs, _ = run_pipeline(config, work)
    assert outputs.data is not None
    return config.tracking.resolved_uri(), config.registered_model_name, outputs.data.data_dir


@contextmanager
def recsys_serve(*options: str, env: Mapping[str, str] | None = None) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """`recsys serve OPTIONS` as a real process on a free loopback port (with `env` added to this process's
    environment), once it is ready.

    Yields (base URL, process); the process is terminated on exit (its output stays readable).
    """
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    recsys = str(Path(sys.executable).with_name("recsys"))  # the console script of this environment
    command = [recsys, "serve", "--port", str(port), *options]
    server = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, **(env or {})}
    )
    from benchmarks.common import wait_until_ok  # it imports the pipelines, hence the kernels: after TRITON_INTERPRET

    base = f"http://127.0.0.1:{port}"
    try:
        if not wait_until_ok(f"{base}/readyz", SERVER_START_S, alive=lambda: server.poll() is None):
            raise AssertionError(_not_ready(server))
        yield base, server
    finally:
        server.terminate()
        server.wait(timeout=20)


# Two workers each import torch and load the model; under a full `-n 2` run on two shared cores that took over 60 s.
SERVER_START_S = 180.0


def _not_ready(server: subprocess.Popen[str]) -> str:
    """Why a served API never answered /readyz: its exit status (or that it still ran) and its last output lines."""
    exited = server.poll()
    server.terminate()
    try:
        output, _ = server.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        server.kill()
        output, _ = server.communicate()
    state = f"it exited with status {exited}" if exited is not None else f"it still ran after {SERVER_START_S:.0f} s"
    tail = "\n".join((output or "").splitlines()[-40:])
    return f"the server never became ready ({state}); its last output lines:\n{tail}"


def unique_codes(num_items: int, sizes: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    """(V+1, T) semantic IDs, a distinct random tuple of codes per item (levels of `sizes` codes), row 0 = padding."""
    every = torch.cartesian_prod(*(torch.arange(k) for k in sizes))
    chosen = every[torch.randperm(len(every), generator=torch.Generator().manual_seed(seed))[:num_items]]
    return torch.cat([torch.zeros(1, len(sizes), dtype=torch.long), chosen])


def tiny_generative(num_items: int, retrieval_candidates: int = 4) -> GenerativeRetriever:
    """A generative retriever over `num_items` items with unique random 3-level codes, the retrieval head on, no
    dropout (compiled and eager steps then draw no masks)."""
    sizes = (8, 8, 8)
    config = GenerativeConfig(
        num_items=num_items, codebook_sizes=sizes, dim=16, num_heads=2, ffn_dim=32, num_encoder_layers=1,
        num_decoder_layers=1, dropout=0.0, beam_size=10, user_buckets=5, retrieval_candidates=retrieval_candidates,
    )  # fmt: skip
    torch.manual_seed(0)
    return GenerativeRetriever(config, unique_codes(num_items, sizes))
