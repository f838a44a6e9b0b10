"""Regenerate the tiny scale's held-out evaluation sets, ``data/tiny_eval/<family>.jsonl``.

    python scripts/make_tiny_eval.py            # rewrite the committed files
    python scripts/make_tiny_eval.py --out DIR  # write them elsewhere

Deterministic: the output equals the committed files unless the generators
changed (``tests/world/test_tasks.py`` checks that they are equal).
"""

from __future__ import annotations

import argparse
import logging

from fp8rl.world.tasks import EVAL_DIR, write_eval_sets


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(EVAL_DIR), help="directory (default: %(default)s)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    write_eval_sets(args.out)


if __name__ == "__main__":
    main()
