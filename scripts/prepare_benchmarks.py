"""Prepare the math benchmarks (and DeepScaleR's training set) in the evaluation schema.

From local copies as published (parquet, JSONL or JSON; the files of each Hugging Face
dataset repository), or, on a machine with internet, fetched with ``datasets``. Each file
goes to ``<root>/<name>.jsonl`` (``{"id", "problem", "answer", "source"}`` per line) with
its sha256, row count and origin in ``<root>/MANIFEST.json`` (docs/evaluation.md).

    python scripts/prepare_benchmarks.py --list
    python scripts/prepare_benchmarks.py --from-local aime24=~/dl/aime_2024/train.parquet
    python scripts/prepare_benchmarks.py --fetch                          # the suite + training
    python scripts/prepare_benchmarks.py --fetch --only aime24,math500 --revision main
    python scripts/prepare_benchmarks.py --check                          # files vs MANIFEST
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from fp8rl.evaluation.benchmarks import DEFAULT_DATA_ROOT, SUITE, TRAIN_SET
from fp8rl.evaluation.prepare import SOURCES, check_manifest, fetch, prepare_local


def _pair(value: str) -> tuple[str, Path]:
    name, sep, path = value.partition("=")
    if not sep or name not in SOURCES:
        raise argparse.ArgumentTypeError(
            f"need NAME=PATH with NAME one of {', '.join(SOURCES)}; got {value!r}"
        )
    return name, Path(path).expanduser()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--list", action="store_true", help="the data sets and their sources")
    mode.add_argument("--from-local", type=_pair, action="append", metavar="NAME=PATH")
    mode.add_argument("--fetch", action="store_true", help="download with datasets (online)")
    mode.add_argument("--check", action="store_true", help="check files against MANIFEST.json")
    parser.add_argument("--only", default=None, help="comma-separated names (with --fetch)")
    parser.add_argument("--revision", default=None, help="dataset revision (with --fetch)")
    parser.add_argument("--root", type=Path, default=DEFAULT_DATA_ROOT)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.list:
        for name, s in SOURCES.items():
            where = f"{s.hf_id}" + (f" ({s.config})" if s.config else "") + f" split {s.split}"
            suite = "suite" if name in SUITE else "training" if name == TRAIN_SET else "extra"
            print(f"{name:14} {suite:8} {where:55} {s.description}")
        return 0
    if args.check:
        problems = {n: v for n, v in check_manifest(args.root).items() if v != "ok"}
        for name, verdict in check_manifest(args.root).items():
            print(f"{name}: {verdict}")
        return 1 if problems else 0
    try:
        if args.from_local:
            for name, path in args.from_local:
                entry = prepare_local(name, path, args.root)
                print(f"{name}: {entry['rows']} rows, sha256 {entry['sha256'][:16]}")
            return 0
        names = args.only.split(",") if args.only else [*SUITE, TRAIN_SET]
        for name in names:
            entry = fetch(name, args.root, revision=args.revision)
            print(f"{name}: {entry['rows']} rows from {entry['origin']['dataset']}")
    except (ValueError, FileNotFoundError) as exc:
        print(f"prepare_benchmarks.py: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
