"""An experiment's compact results, copied out of a run store into ``results/`` (in git).

``runs/`` is not in git and the machine that holds it is not kept, so a study exports what
its reports need as each piece finishes: per finished run (done, failed or pruned, of the
current results version) its ``config.yaml``, ``status.json``, ``provenance.json``,
``metrics.jsonl``, ``eval.jsonl``, ``lm_eval.jsonl`` (when it was evaluated with lm-eval)
and ``integrity.json`` — no checkpoints or HF exports, and at most
``samples`` token-level sample dumps (the first, last and middle steps' first, so two runs
on one dump schedule keep the same steps: the token viewer pairs them), rewritten as
compact JSON (the same values in two thirds of an indented dump's bytes). Metrics whose names
start with one of ``drop_prefixes`` are left out of the copy's ``metrics.jsonl``; by default
the per-layer FP8 statistics (``fp8rl/fp8/*``, 348 of a blockwise step's 540 metrics, 64%
of its bytes), which no report reads and which stay in the run store. The copy has the run
store's layout (``results/<experiment>/<run_id>/``), so every reader takes either.

Each run is written atomically (``fp8rl.runs.atomic.atomic_directory``: built under a
``.tmp-`` name, then swapped in), an exported run is replaced only when what it would write
changed, and runs not finished (pending, running, damaged, stale) are skipped and listed. An
export killed at any point leaves every run it replaced complete, old or new (or, where the
OS lacks an atomic exchange, missing with its old copy under ``.old-``, which readers take);
the next export first puts the destination right (``recover_directories``: an ``.old-`` copy
renamed back, ``.tmp-``/``.old-`` leftovers removed), whichever runs it then writes.

A done run's integrity record is made anew for the copy (``fp8rl.runs.integrity.make_record``:
its logs' per-line digests, no checkpoints, the source's config hash and finish time) with
``exported_from`` saying what was left out, so a reader checks an exported run exactly as it
checks a run.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

from fp8rl.analysis.load import as_store
from fp8rl.runs import (
    LM_EVAL_FILE,
    RunStatus,
    RunStore,
    atomic_directory,
    atomic_write_json,
    read_step_log,
)
from fp8rl.runs.atomic import recover_directories
from fp8rl.runs.integrity import make_record
from fp8rl.runs.jsonl import encode_record
from fp8rl.runs.store import CONFIG_FILE, EVAL_FILE, METRICS_FILE, STATUS_FILE

logger = logging.getLogger(__name__)

__all__ = ["DROPPED_METRICS", "EXPORTED_FILES", "ExportSummary", "export_experiment"]

EXPORTED_FILES = (
    CONFIG_FILE,
    STATUS_FILE,
    "provenance.json",
    METRICS_FILE,
    EVAL_FILE,
    LM_EVAL_FILE,  # lm-eval's rows, where the run has them (not its per-sample logs)
)
_FINAL = (RunStatus.DONE, RunStatus.FAILED, RunStatus.PRUNED)
#: The uncommitted diffs a run started from (``code-<hash>.diff``, beside its provenance):
#: small, and what rebuilds such a run, so exported with it.
CODE_DIFF_GLOB = "code-*.diff"
#: Metric-name prefixes left out of an export by default (module docstring).
DROPPED_METRICS: tuple[str, ...] = ("fp8rl/fp8/",)


@dataclass
class ExportSummary:
    experiment: str
    destination: Path
    written: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # run_id -> why

    def text(self) -> str:
        parts = [
            f"{self.experiment} -> {self.destination}: {len(self.written)} written, "
            f"{len(self.unchanged)} unchanged, {len(self.skipped)} skipped"
        ]
        parts += [f"  skipped {rid}: {why}" for rid, why in sorted(self.skipped.items())]
        return "\n".join(parts)


def _contents(run_dir: Path, drop: tuple[str, ...]) -> dict[str, bytes]:
    """What the export writes for each of :data:`EXPORTED_FILES` the run has."""
    out = {}
    diffs = tuple(sorted(p.name for p in run_dir.glob(CODE_DIFF_GLOB)))
    for name in (*EXPORTED_FILES, *diffs):
        path = run_dir / name
        if not path.exists():
            continue
        if name == METRICS_FILE and drop:
            out[name] = b"".join(
                encode_record(
                    r["step"], {k: v for k, v in r["data"].items() if not k.startswith(drop)}
                )
                for r in read_step_log(path).records
            )
        else:
            out[name] = path.read_bytes()
    return out


def _compact(path: Path) -> bytes:
    """A sample dump as compact JSON (the same values; older dumps were indented); a file
    that does not parse is copied as it is."""
    raw = path.read_bytes()
    try:
        return (json.dumps(json.loads(raw), separators=(",", ":")) + "\n").encode()
    except ValueError:
        return raw


def _unchanged(target: Path, contents: dict[str, bytes], samples: dict[str, bytes]) -> bool:
    if not target.is_dir():
        return False
    have = {p.name for p in target.iterdir() if p.name in EXPORTED_FILES or p.match(CODE_DIFF_GLOB)}
    if have != set(contents):
        return False
    if any((target / name).read_bytes() != data for name, data in contents.items()):
        return False
    have_samples = sorted((target / "samples").glob("*.json"))
    if {p.name for p in have_samples} != set(samples):
        return False
    return all(p.read_bytes() == samples[p.name] for p in have_samples)


def _pick_samples(samples_dir: Path, n: int) -> list[Path]:
    files = sorted(samples_dir.glob("*.json")) if samples_dir.is_dir() else []
    if n <= 0 or not files:
        return []
    picked = [files[0], files[-1], files[len(files) // 2], *files[1:-1]]
    return sorted(list(dict.fromkeys(picked))[:n])


def export_experiment(
    source: RunStore | Path | str,
    experiment: str,
    destination: Path | str,
    *,
    samples: int = 3,
    drop_prefixes: tuple[str, ...] = DROPPED_METRICS,
    results_version: int | None = None,
    run_ids: Collection[str] | None = None,
) -> ExportSummary:
    """Export ``experiment``'s finished runs from ``source`` to ``destination/<experiment>``
    (module docstring); returns what was written, left unchanged and skipped.
    ``results_version``: the version whose runs are current (and exported; runs of another
    version are skipped as stale); default the source store's (the code's current one).
    ``run_ids``: only these runs (None: every run of the experiment)."""
    store = as_store(source)
    if results_version is not None and results_version != store.results_version:
        store = RunStore(store.root, results_version=results_version)
    dest_root = Path(destination)
    summary = ExportSummary(experiment, dest_root / experiment)
    recover_directories(summary.destination)  # what a killed export left
    for info in store.list_runs(experiment):
        if run_ids is not None and info.run_id not in run_ids:
            continue
        if info.stale:
            summary.skipped[info.run_id] = f"stale (results version {info.results_version})"
            continue
        if info.status not in _FINAL:
            summary.skipped[info.run_id] = f"{info.status.value}: {info.reason}".rstrip(": ")
            continue
        target = summary.destination / info.run_id
        chosen = {p.name: _compact(p) for p in _pick_samples(info.path / "samples", samples)}
        contents = _contents(info.path, tuple(drop_prefixes))
        if _unchanged(target, contents, chosen):
            summary.unchanged.append(info.run_id)
            continue
        with atomic_directory(target, overwrite=True) as tmp:
            for name, data in contents.items():
                (tmp / name).write_bytes(data)
            if chosen:
                (tmp / "samples").mkdir()
                for name, data in chosen.items():
                    (tmp / "samples" / name).write_bytes(data)
            record_path = info.path / "integrity.json"
            if record_path.exists():
                source_record = json.loads(record_path.read_text())
                record = make_record(
                    tmp, source_record.get("config_sha256"), source_record.get("finished_at")
                )
                record["exported_from"] = {
                    "dropped_metric_prefixes": list(drop_prefixes),
                    "checkpoints_left_out": sorted(source_record.get("checkpoints") or {}),
                }
                atomic_write_json(tmp / "integrity.json", record)
        summary.written.append(info.run_id)
        logger.info("exported %s/%s", experiment, info.run_id)
    return summary
