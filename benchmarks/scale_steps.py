"""The steps of `benchmarks.scale` that have no `recsys` command of their own, as commands it runs in a child process.

Usage:
    .venv/bin/python -m benchmarks.scale_steps generate --num-users 100000 --num-items 10000 --out /tmp/generated
    .venv/bin/python -m benchmarks.scale_steps p5-text --data-dir data/synthetic --out /tmp/p5/amazon-synthetic

generate: the synthetic generator alone (`features.synthetic.iter_synthetic`), streamed to parquet files in --out
(items.parquet, interactions-*.parquet). p5-text: a prepared directory in the P5 text form (`features.export`), which
`recsys data prepare --source amazon-p5 --input OUT` reads back.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from features.export import write_p5
from features.synthetic import SyntheticConfig, iter_synthetic, synthetic_items

USERS_PER_CHUNK = 100_000  # as benchmarks.synthetic_scale streams: ~60 MB a chunk


def generate(num_users: int, num_items: int, out: Path, seed: int = 0) -> int:
    """Stream the synthetic data set of `num_users` x `num_items` into parquet files in `out`; returns the rows."""
    config = SyntheticConfig(seed=seed, num_users=num_users, num_items=num_items)
    out.mkdir(parents=True, exist_ok=True)
    synthetic_items(config).write_parquet(out / "items.parquet")
    rows = 0
    for index, chunk in enumerate(iter_synthetic(config, users_per_chunk=USERS_PER_CHUNK)):
        chunk.write_parquet(out / f"interactions-{index:05d}.parquet")
        rows += chunk.height
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    steps = parser.add_subparsers(dest="step", required=True)
    generated = steps.add_parser("generate", help="the synthetic generator streamed to parquet")
    generated.add_argument("--num-users", type=int, required=True)
    generated.add_argument("--num-items", type=int, required=True)
    generated.add_argument("--seed", type=int, default=0)
    generated.add_argument("--out", type=Path, required=True)
    p5 = steps.add_parser("p5-text", help="a prepared directory in the P5 text form")
    p5.add_argument("--data-dir", type=Path, required=True, help="a directory written by `recsys data prepare`")
    p5.add_argument("--out", type=Path, required=True, help="the P5 directory to write")
    args = parser.parse_args(argv)
    # not benchmarks.common.log_to_console: its module imports torch, which would weigh on these steps' RSS
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.step == "generate":
        rows = generate(args.num_users, args.num_items, args.out, args.seed)
        print(f"generated {rows:,} interactions into {args.out}")
    else:
        export = write_p5(args.data_dir, args.out)
        print(f"wrote {export.users:,} users, {export.interactions:,} interactions into {export.out_dir}")


if __name__ == "__main__":
    main()
