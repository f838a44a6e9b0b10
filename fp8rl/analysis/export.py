"""An experiment's compact results, copied out of a run store into ``results/`` (in git).

``runs/`` is not in git and the machine that holds it is not kept, so a study exports what
its reports need as each piece finishes: per finished run (done, failed or pruned, of the
current results version) its ``config.yaml``, ``status.json``, ``provenance.json``,
``metrics.jsonl``, ``eval.jsonl`` and ``integrity.json`` — no checkpoints, and at most
``samples`` token-level sample dumps (the first and last steps' first). The copy has the run
store's layout (``results/<experiment>/<run_id>/``), so every reader takes either.

Each run is written atomically (built under a temporary name, then renamed), an exported
run is replaced only when its source changed, and runs not finished (pending, running,
damaged, stale) are skipped and listed. The integrity record is rewritten for the copy:
the same per-line digests, the copy's sizes and times, and no checkpoints (the copy has
none by design), so a reader checks the exported logs exactly as it checks a run's.
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from fp8rl.analysis.load import as_store
from fp8rl.runs import RunStatus, RunStore, atomic_directory, atomic_write_json

logger = logging.getLogger(__name__)

__all__ = ["EXPORTED_FILES", "ExportSummary", "export_experiment"]

EXPORTED_FILES = ("config.yaml", "status.json", "provenance.json", "metrics.jsonl", "eval.jsonl")
_FINAL = (RunStatus.DONE, RunStatus.FAILED, RunStatus.PRUNED)


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


def _same_content(src: Path, dst: Path) -> bool:
    for name in EXPORTED_FILES:
        a, b = src / name, dst / name
        if a.exists() != b.exists():
            return False
        if a.exists() and a.read_bytes() != b.read_bytes():
            return False
    return True


def _pick_samples(samples_dir: Path, n: int) -> list[Path]:
    files = sorted(samples_dir.glob("*.json")) if samples_dir.is_dir() else []
    if n <= 0 or not files:
        return []
    picked = [files[0], files[-1], *files[1:-1]]
    return sorted(dict.fromkeys(picked[:n]))


def export_experiment(
    source: RunStore | Path | str, experiment: str, destination: Path | str, *, samples: int = 2
) -> ExportSummary:
    """Export ``experiment``'s finished runs from ``source`` to ``destination/<experiment>``
    (module docstring); returns what was written, left unchanged and skipped."""
    store = as_store(source)
    dest_root = Path(destination)
    summary = ExportSummary(experiment, dest_root / experiment)
    for info in store.list_runs(experiment):
        if info.stale:
            summary.skipped[info.run_id] = f"stale (results version {info.results_version})"
            continue
        if info.status not in _FINAL:
            summary.skipped[info.run_id] = f"{info.status.value}: {info.reason}".rstrip(": ")
            continue
        target = summary.destination / info.run_id
        chosen = _pick_samples(info.path / "samples", samples)
        if target.exists() and _same_content(info.path, target):
            have = {p.name for p in (target / "samples").glob("*.json")}
            if have == {p.name for p in chosen}:
                summary.unchanged.append(info.run_id)
                continue
        with atomic_directory(target, overwrite=True) as tmp:
            for name in EXPORTED_FILES:
                if (info.path / name).exists():
                    shutil.copy2(info.path / name, tmp / name)
            if chosen:
                (tmp / "samples").mkdir()
                for path in chosen:
                    shutil.copy2(path, tmp / "samples" / path.name)
            record_path = info.path / "integrity.json"
            if record_path.exists():
                record = json.loads(record_path.read_text())
                for name, log in (record.get("logs") or {}).items():
                    copied = tmp / name
                    if copied.exists():
                        st = copied.stat()
                        log["size"], log["mtime_ns"] = st.st_size, st.st_mtime_ns
                record["checkpoints"] = {}
                record["exported_from"] = {"path": str(info.path), "checkpoints_left_out": True}
                atomic_write_json(tmp / "integrity.json", record)
        summary.written.append(info.run_id)
        logger.info("exported %s/%s", experiment, info.run_id)
    return summary
