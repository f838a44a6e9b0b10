#!/usr/bin/env bash
# The GPU check (issue 32): on a single-GPU machine with torch and no TorchAO, install the
# carried TorchAO wheel into a folder, put that folder and this repository on PYTHONPATH (no
# `pip install -e .`: pyproject.toml asks for Python < 3.12, the GPU machine has 3.12), and run
# benchmarks/bench_fp8_throughput.py into one output folder, the whole under 8 minutes.
#
#   scripts/gpu_check.sh [--out DIR] [--wheel WHEEL] [--target DIR] [--budget SECONDS]
#                        [--installer auto|pip|unzip] [--python PY] [--dry-run] [--install-only]
#                        [-- BENCHMARK_ARGS...]
#
#   --out DIR        where table.md, results.json, environment.json, log.txt and nvidia-smi.txt
#                    go (default: outputs/gpu-check)
#   --wheel WHEEL    the TorchAO wheel (default: the one wheels/torchao-0.18.0-*.whl; get it
#                    with `pip download torchao==0.18.0 --no-deps -d wheels/` where PyPI is
#                    reachable)
#   --target DIR     where it is installed (default: build/gpu-check/site-packages)
#   --budget S       hard limit of the benchmark process (default 450; the benchmark starts no
#                    new shape after S - 120 seconds and rewrites its outputs after every shape,
#                    so a run stopped at the limit keeps what it measured)
#   --installer      pip: `pip install --no-index --no-deps --target DIR WHEEL`; unzip: Python's
#                    zipfile (a wheel is a zip); auto (default): pip if `PY -m pip` works
#   --python PY      the interpreter (default: $PYTHON, else python3)
#   --dry-run        print what would run, run nothing
#   --install-only   install the wheel and stop
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT_DIR="$REPO/outputs/gpu-check"
WHEEL=""
TARGET="$REPO/build/gpu-check/site-packages"
BUDGET=450
INSTALLER=auto
PY="${PYTHON:-python3}"
DRY_RUN=0
INSTALL_ONLY=0
BENCH_ARGS=()

die() { echo "gpu_check.sh: $*" >&2; exit 2; }
usage() { sed -n '7,24s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"; }
need() { [[ $# -ge 2 && -n $2 ]] || die "$1 needs a value"; }

while (($#)); do
    case "$1" in
        --out) need "$@"; OUT_DIR="$2"; shift 2 ;;
        --wheel) need "$@"; WHEEL="$2"; shift 2 ;;
        --target) need "$@"; TARGET="$2"; shift 2 ;;
        --budget) need "$@"; BUDGET="$2"; shift 2 ;;
        --installer) need "$@"; INSTALLER="$2"; shift 2 ;;
        --python) need "$@"; PY="$2"; shift 2 ;;
        --dry-run) DRY_RUN=1; shift ;;
        --install-only) INSTALL_ONLY=1; shift ;;
        -h | --help) usage; exit 0 ;;
        --) shift; BENCH_ARGS=("$@"); break ;;
        *) usage >&2; die "unknown argument '$1' (benchmark options go after --)" ;;
    esac
done

[[ $BUDGET =~ ^[0-9]+$ ]] && ((BUDGET >= 180)) \
    || die "--budget is whole seconds, at least 180 (120 are kept for the last shape), not '$BUDGET'"
case "$INSTALLER" in auto | pip | unzip) ;; *) die "--installer is auto, pip or unzip, not '$INSTALLER'" ;; esac
if [[ -z $WHEEL ]]; then
    shopt -s nullglob
    found=("$REPO"/wheels/torchao-0.18.0-*.whl)
    shopt -u nullglob
    ((${#found[@]} == 1)) || die "expected one wheels/torchao-0.18.0-*.whl, found ${#found[@]}:" \
        "run 'pip download torchao==0.18.0 --no-deps -d wheels/' where PyPI is reachable and" \
        "carry wheels/ to this machine, or name the wheel with --wheel"
    WHEEL="${found[0]}"
fi
[[ -f $WHEEL ]] || die "no wheel at '$WHEEL'"
if [[ $INSTALLER == auto ]]; then
    if "$PY" -m pip --version >/dev/null 2>&1; then INSTALLER=pip; else INSTALLER=unzip; fi
fi
case "$INSTALLER" in
    pip) INSTALL=("$PY" -m pip install --no-index --no-deps --upgrade --target "$TARGET" "$WHEEL") ;;
    unzip) INSTALL=("$PY" -m zipfile -e "$WHEEL" "$TARGET") ;;
esac
export PYTHONPATH="$TARGET:$REPO${PYTHONPATH:+:$PYTHONPATH}"
RUN=(timeout --signal=TERM --kill-after=15 "$BUDGET" "$PY" "$REPO/benchmarks/bench_fp8_throughput.py"
    --out "$OUT_DIR" --max-seconds "$((BUDGET - 120))" "${BENCH_ARGS[@]}")

if ((DRY_RUN)); then
    echo "install: ${INSTALL[*]}"
    echo "PYTHONPATH=$PYTHONPATH"
    ((INSTALL_ONLY)) || echo "run: ${RUN[*]} 2>&1 | tee $OUT_DIR/log.txt"
    exit 0
fi

mkdir -p "$TARGET"
echo "install: ${INSTALL[*]}"
"${INSTALL[@]}"
PKG="$(basename "$WHEEL")"
PKG="${PKG%%-*}"  # the distribution name of the wheel's file name: torchao
"$PY" -c "import $PKG as m; print(m.__name__, getattr(m, '__version__', '?'), 'from', m.__file__)" \
    || die "$PKG does not import from $TARGET"
((INSTALL_ONLY)) && exit 0
"$PY" -c 'import sys, torch; print(f"python {sys.version.split()[0]}, torch {torch.__version__}, cuda {torch.version.cuda}, gpu {torch.cuda.is_available()}")' \
    || die "'$PY' cannot import torch"

mkdir -p "$OUT_DIR"
if command -v nvidia-smi >/dev/null; then nvidia-smi >"$OUT_DIR/nvidia-smi.txt" 2>&1 || true; fi
echo "run: ${RUN[*]}"
status=0
"${RUN[@]}" 2>&1 | tee "$OUT_DIR/log.txt" || status=$?
if ((status == 124 || status == 137)); then
    echo "gpu_check.sh: the benchmark hit its ${BUDGET} s budget; $OUT_DIR/table.md holds the" \
        "shapes it finished (marked INCOMPLETE)" >&2
fi
exit "$status"
