"""Prepare a tiny model's verl run: the tiny base as a Hugging Face Qwen3 and the tiny task
families as verl parquet (what the verl backend's launcher runs before verl for
``model=tiny-*``; runnable by hand from a dry run's printed command).

    python scripts/verl_prepare_tiny.py --config <run>/verl/run_config.json --out <run>/verl \
        [--cache-dir DIR]

Reads the resolved run config (``RunConfig.to_dict`` JSON), calls
``fp8rl.verl_ext.tiny_world.prepare`` (what it writes: that module's docstring) and prints
its summary as one JSON line. The launcher (``fp8rl.verl_ext.launch``) runs it as a
subprocess.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from fp8rl.config import RunConfig
from fp8rl.verl_ext.tiny_world import prepare


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--cache-dir", type=Path, default=None)
    args = ap.parse_args(argv)
    cfg = RunConfig.from_dict(json.loads(args.config.read_text()))
    print(json.dumps(prepare(cfg, args.out, args.cache_dir)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
