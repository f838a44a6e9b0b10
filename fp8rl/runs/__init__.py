"""The run store: where every run lives, with provenance, atomic writes, resume and staleness.

Ground floor: imports no other fp8rl room, and no torch until a checkpoint or
provenance needs it. See ``docs/run_store.md`` and :mod:`fp8rl.runs.store`.
"""

from fp8rl.runs.atomic import (
    atomic_directory,
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
)
from fp8rl.runs.checkpoints import (
    Checkpoint,
    RngStreams,
    TrainState,
    capture_rng_state,
    checkpoint_step,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    restore_rng_state,
    save_checkpoint,
)
from fp8rl.runs.errors import (
    CorruptLogError,
    RunIdentityError,
    RunLockedError,
    RunPruned,
    RunStoreError,
    disk_full_error,
)
from fp8rl.runs.exports import (
    HF_EXPORTS_DIR,
    LM_EVAL_DIR,
    LM_EVAL_FILE,
    hf_export_dir,
    list_hf_exports,
)
from fp8rl.runs.ids import (
    RESULTS_VERSION,
    canonical_json,
    config_sha256,
    flatten_config,
    run_id_for,
    to_plain,
)
from fp8rl.runs.jsonl import StepLog, read_step_log
from fp8rl.runs.provenance import collect_provenance
from fp8rl.runs.store import (
    DISK_FULL_REASON,
    EXPERIMENT_NAME_RULE,
    Decision,
    Run,
    RunInfo,
    RunStatus,
    RunStore,
    check_experiment_name,
    has_run_files,
    list_runs,
    to_records,
)
from fp8rl.runs.summary import RunSummary

__all__ = [
    "DISK_FULL_REASON",
    "EXPERIMENT_NAME_RULE",
    "HF_EXPORTS_DIR",
    "LM_EVAL_DIR",
    "LM_EVAL_FILE",
    "RESULTS_VERSION",
    "Checkpoint",
    "CorruptLogError",
    "Decision",
    "RngStreams",
    "Run",
    "RunIdentityError",
    "RunInfo",
    "RunLockedError",
    "RunPruned",
    "RunStatus",
    "RunStore",
    "RunStoreError",
    "RunSummary",
    "StepLog",
    "TrainState",
    "atomic_directory",
    "atomic_write_bytes",
    "atomic_write_json",
    "atomic_write_text",
    "canonical_json",
    "capture_rng_state",
    "check_experiment_name",
    "checkpoint_step",
    "collect_provenance",
    "config_sha256",
    "disk_full_error",
    "flatten_config",
    "has_run_files",
    "hf_export_dir",
    "latest_checkpoint",
    "list_checkpoints",
    "list_hf_exports",
    "list_runs",
    "load_checkpoint",
    "read_step_log",
    "restore_rng_state",
    "run_id_for",
    "save_checkpoint",
    "to_plain",
    "to_records",
]
