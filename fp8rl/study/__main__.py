"""``python -m fp8rl.study``: :func:`fp8rl.study.cli.main` on the command line."""

import sys

from fp8rl.study.cli import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], sys.stdout, sys.stderr))
