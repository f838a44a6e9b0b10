"""``make reproduce-table2``: which grids a size runs, and where its results and report go.

Five sizes (``experiments/conf/experiment/table2*.yaml``; their measured times are in
``docs/analysis.md``, written from the runs' own records):

* ``quick``   — ``table2_quick``: the test preset (tiny-test base, 2 steps), one seed;
  checks the whole path, its numbers mean nothing. Results and report under ``runs/`` (not
  in git).
* ``default`` — ``table2_world``: the paper's six Table-2 rows (BF16, FP8 rollout + BF16
  training, tensorwise / rowwise / blockwise FP8, blockwise FP8 + CC), one seed, 30 steps
  on the learning world (the shipped slip base, ``docs/tiny_backend.md``), where BF16 gains
  about 12 points: fifteen minutes on an idle 2-core machine, two runs at a time. Results in
  ``results/``, report in ``docs/reports/``.
* ``small``   — ``table2_small`` (the default before issue 46; its committed results keep
  their run ids): the same six rows, 10 steps on the Table-2 study's scale model (the clean
  1200-step base), where BF16 does not gain.
* ``medium``  — ``table2_default`` (the default before issue 28; its committed results keep
  their run ids): BF16 and the three granularities x standard and CC plus the FP8-rollout
  row, one seed, 50 steps on the 600-step tiny-s base.
* ``full``    — ``table2``: the pre-registered Table-2 study (its protocol:
  :data:`STUDY_PROTOCOL`, docs/study/table2_protocol.md, committed before its first run);
  hours, resumable. Its report adds the study's endpoints and verdicts
  (:mod:`fp8rl.analysis.study`, :mod:`fp8rl.analysis.study_report`).

The ``quick`` and ``medium`` sizes are two grids into one experiment: the experiment's own
(BF16 and the three FP8 granularities x standard and Calibrated Clipping, BF16 + CC being a
control) and the FP8 rollout + BF16 training row (``granularity=fp8_rollout_only
clipping=standard``). The ``default`` and ``small`` sizes are one grid per arm
(:data:`SMALL_ARMS`), so ``--jobs 2`` keeps two lanes busy. The ``full`` size adds the
study's two controls on one granularity G (:data:`STUDY_CONTROL_GRANULARITY`): Calibrated
Clipping of the lower bound only (``clipping=lower_only``) and the CISPO loss, which never
zeroes a gradient (``clipping=cispo``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fp8rl.config import ConfigError

__all__ = [
    "SIZES",
    "SIZE_FLAGS",
    "SMALL_ARMS",
    "STUDY_CONTROL_GRANULARITY",
    "STUDY_GRANULARITIES",
    "STUDY_PROTOCOL",
    "TINY_MODEL_OPTIONS",
    "Table2Plan",
    "control_grids",
    "plan_table2",
]

SIZES: dict[str, str] = {
    "quick": "table2_quick",
    "default": "table2_world",
    "small": "table2_small",
    "medium": "table2_default",
    "full": "table2",
}
#: The make flag that selects each size (the default has none).
SIZE_FLAGS: dict[str, str] = {
    "quick": " QUICK=1",
    "default": "",
    "small": " SMALL=1",
    "medium": " MEDIUM=1",
    "full": " FULL=1",
}
#: The ``default`` and ``small`` sizes' arms (granularity, clipping), one grid each: the
#: paper's Table-2 rows, in the order they start: FP8 training first (its steps cost the
#: most), so the two lanes end close together.
SMALL_ARMS: tuple[tuple[str, str], ...] = (
    ("blockwise", "calibrated"),
    ("blockwise", "standard"),
    ("rowwise", "standard"),
    ("tensorwise", "standard"),
    ("fp8_rollout_only", "standard"),
    ("bf16", "standard"),
)

#: The model option of each size's tiny model, named on a backend whose own default model is
#: another (``backend=verl cluster=local_cpu``: verl's real trainer on this CPU runs the tiny
#: study; the model then selects the tiny scale, ``fp8rl.experiments.compose.with_world_scale``).
TINY_MODEL_OPTIONS: dict[str, str] = {
    "quick": "tiny_test",
    "default": "tiny-s",
    "small": "tiny-s",
    "medium": "tiny-s",
    "full": "tiny-s",
}
#: Clusters that run the tiny study on a cluster backend (``experiments/conf/cluster/``).
CPU_CLUSTERS = ("local_cpu",)

#: The granularity G of the study's two controls (lower-only CC, CISPO): the noisiest one,
#: as the protocol chooses it.
STUDY_CONTROL_GRANULARITY = "rowwise"
#: The granularities of experiment/table2.yaml's grid (the full size runs one grid each).
STUDY_GRANULARITIES = ("bf16", "tensorwise", "rowwise", "blockwise")

#: The pre-registered protocol of the ``full`` size, relative to the repository root.
STUDY_PROTOCOL = "docs/study/table2_protocol.md"


@dataclass(frozen=True)
class Table2Plan:
    size: str
    experiment: str
    grids: list[list[str]]  # sweep.py overrides, one list per invocation
    runs_dir: Path
    results_dir: Path
    report_dir: Path
    commands: list[str]  # the user-facing commands that reproduce it

    @property
    def sweep_grids(self) -> tuple[tuple[str, ...], ...]:
        """:attr:`grids` without their ``runs_dir`` (the study room sets its own)."""
        return tuple(tuple(o for o in g if not o.startswith("runs_dir=")) for g in self.grids)


def plan_table2(
    size: str = "default",
    *,
    seeds: str | None = None,
    backend: str = "tiny",
    cluster: str | None = None,
    threads: int = 2,
    runs_dir: Path | str = "runs",
    cache_dir: Path | str | None = None,
    results_dir: Path | str | None = None,
    report_dir: Path | str | None = None,
) -> Table2Plan:
    """The grids and folders of ``make reproduce-table2`` at ``size`` (module docstring).

    ``seeds``: a comma-separated list replacing the size's seeds (``0,1,2``);
    ``cache_dir``: the base-model cache (None: the backend's default); ``cluster``: a
    ``cluster`` option for a cluster backend (``local_cpu``: the tiny study through verl's
    trainer on this CPU, the size's tiny model named, :data:`TINY_MODEL_OPTIONS`). Raises
    ConfigError for an unknown size, a malformed seed list or a cluster without a cluster
    backend.
    """
    if size not in SIZES:
        raise ConfigError(f"unknown size {size!r}: expected one of {', '.join(SIZES)}")
    experiment = SIZES[size]
    runs_dir = Path(runs_dir)
    if seeds is not None:
        parts = [s.strip() for s in str(seeds).split(",")]
        if not parts or not all(p.isdigit() for p in parts):
            raise ConfigError(f"SEEDS={seeds!r}: expected comma-separated non-negative integers")
        seeds = ",".join(parts)
    common = [f"+experiment={experiment}", f"threads={threads}", f"runs_dir={runs_dir}"]
    if cache_dir is not None:
        common.append(f"cache_dir={cache_dir}")
    experiment, placed = _backend_overrides(size, experiment, backend, cluster)
    common += placed
    if seeds is not None:
        common.append(f"seed={seeds}")
    rollout_arm = [*common, "granularity=fp8_rollout_only", "clipping=standard"]
    grids = [common, rollout_arm]
    if size == "full":  # one grid per granularity, so `--jobs 2` keeps two lanes busy
        grids = [[*common, f"granularity={g}"] for g in STUDY_GRANULARITIES]
        grids += [rollout_arm, *control_grids(common)]
    elif size in ("default", "small"):  # one grid per arm (SMALL_ARMS' order)
        grids = [[*common, f"granularity={g}", f"clipping={c}"] for g, c in SMALL_ARMS]
    if results_dir is None:
        results_dir = runs_dir / "results" if size == "quick" else Path("results")
    if report_dir is None:
        base = runs_dir / "reports" if size == "quick" else Path("docs/reports")
        report_dir = base / experiment
    extra = f" SEEDS={seeds}" if seeds is not None else ""
    if backend != "tiny":
        extra += f" BACKEND={backend}" + (f" CLUSTER={cluster}" if cluster else "")
    commands = [f"make reproduce-table2{SIZE_FLAGS[size]}{extra}"]
    return Table2Plan(
        size, experiment, grids, runs_dir, Path(results_dir), Path(report_dir), commands
    )


def _backend_overrides(
    size: str, experiment: str, backend: str, cluster: str | None
) -> tuple[str, list[str]]:
    """The experiment folder and the overrides that place a size's grids on ``backend`` (and
    ``cluster``): a backend other than tiny gets its own folder, so a report never mixes two
    backends' runs; a CPU cluster names the size's tiny model."""
    overrides: list[str] = []
    if backend != "tiny":
        experiment = f"{experiment}_{backend}"
        overrides += [f"backend={backend}", f"experiment_name={experiment}"]
    if cluster is not None:
        if backend == "tiny":
            raise ConfigError(f"CLUSTER={cluster}: a cluster is a cluster backend's (BACKEND=verl)")
        overrides.append(f"cluster={cluster}")
        if cluster in CPU_CLUSTERS:
            overrides.append(f"model={TINY_MODEL_OPTIONS[size]}")
    return experiment, overrides


def control_grids(
    common: list[str], granularity: str = STUDY_CONTROL_GRANULARITY
) -> list[list[str]]:
    """The study's control grids at ``granularity``: Calibrated Clipping of the lower bound
    only (experiments/conf/clipping/lower_only.yaml) and the CISPO loss (cispo.yaml)."""
    at = [*common, f"granularity={granularity}"]
    return [[*at, "clipping=lower_only"], [*at, "clipping=cispo"]]
