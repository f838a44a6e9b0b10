"""lm-eval on one HF checkpoint: the task files, the model's arguments, the call, the
per-sample logs.

One evaluation (:func:`run_lm_eval`) takes a checkpoint directory, the benchmarks and the
:class:`~fp8rl.evaluation.settings.LmEvalSettings`, and

1. plans each benchmark's items (:func:`plan_tasks`: a tiny family's stratified sample,
   the in-loop evaluator's, or a math benchmark's first ``limit`` problems);
2. writes one task YAML per benchmark into ``<out>/tasks/`` (:func:`write_task_dir`):
   ``include:`` of the committed task file (``fp8rl/evaluation/tasks/``), the data file's
   absolute path, ``repeats: k`` and the generation settings — the exact tasks the numbers
   came from, loadable with ``lm_eval --include_path <out>/tasks``;
3. builds lm-eval's model arguments for the engine (:func:`model_args`: ``hf`` with
   ``pretrained=<dir>`` and ``dtype``, its ``device`` apart; ``vllm`` with ``dtype``,
   ``quantization``, ``tensor_parallel_size``, ``gpu_memory_utilization``, ``seed``) and the
   equivalent
   command line (:func:`lm_eval_command`, saved as ``<out>/command.txt``);
4. calls ``lm_eval.simple_evaluate`` with a ``TaskManager`` over ``<out>/tasks`` only
   (lm-eval's thousands of built-in tasks are not indexed), and writes lm-eval's results
   (``results.json``) and its per-sample logs (``samples_<task>.jsonl``: document, prompt,
   every response, per-document metrics) into ``<out>``.

Its metrics use the run store's names: ``val-core/<benchmark>/acc/mean@<k>`` (avg@k over
all k samples of every problem), ``val-aux/<benchmark>/acc/pass@<k>``,
``val-aux/<benchmark>/boxed/mean@<k>`` and the unweighted means over benchmarks under
``all``. Nothing here downloads: checkpoints are local directories and data files are local
JSONL (``dataset_path: json``). vLLM is imported by lm-eval only when ``engine=vllm`` runs.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import shlex
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any

import yaml

from fp8rl.config import stratified_counts
from fp8rl.evaluation.benchmarks import (
    BENCHMARKS,
    TINY_BENCHMARKS,
    TINY_DIFFICULTIES,
    TINY_EVAL_DIR,
    benchmark_path,
    file_sha256,
    read_benchmark,
    read_tiny_eval,
    tiny_item_indices,
)
from fp8rl.evaluation.settings import LmEvalSettings
from fp8rl.runs import atomic_write_text

__all__ = [
    "TASKS_DIR",
    "TASKS_VERSION",
    "EvalOutcome",
    "TaskPlan",
    "file_sha256",
    "generation_kwargs",
    "lm_eval_command",
    "model_args",
    "plan_tasks",
    "run_lm_eval",
    "settings_fingerprint",
    "task_name",
    "write_task_dir",
]

log = logging.getLogger(__name__)

TASKS_DIR = Path(__file__).resolve().parent / "tasks"
"""The committed lm-eval task files (``--include_path``)."""
TASKS_VERSION = 1
"""Bump when a task file or the scoring changes what a number means (it enters the
settings fingerprint, so evaluations are redone rather than reused)."""


def task_name(benchmark: str) -> str:
    """The lm-eval task of a benchmark (prefixed: lm-eval ships its own ``aime24``)."""
    if benchmark in TINY_BENCHMARKS:
        return f"fp8rl_tiny_{benchmark}"
    if benchmark in BENCHMARKS:
        return f"fp8rl_{benchmark}"
    known = [*TINY_BENCHMARKS, *BENCHMARKS]
    raise ValueError(f"unknown benchmark {benchmark!r}; known: {known}")


@dataclass(frozen=True)
class TaskPlan:
    """One benchmark of an evaluation: its task, data file, items and their description."""

    benchmark: str
    task: str
    kind: str  # "tiny" or "math"
    data_file: Path
    indices: list[int] | None  # rows evaluated (None: every row)
    n_items: int
    items: str  # what was measured, in words

    @property
    def max_gen_toks(self) -> int:
        return 80 if self.kind == "tiny" else 4096


def _tiny_label(limit: int | None, n: int) -> str:
    levels = list(TINY_DIFFICULTIES)
    if limit is None:
        return f"difficulties 1-3, every held-out item ({n})"
    split = "/".join(str(c) for c in stratified_counts(limit, levels).values() if c)
    return f"difficulties 1-3, {split} per difficulty ({n} items, stratified)"


def plan_tasks(
    benchmarks: Sequence[str], settings: LmEvalSettings, *, data_root: str | Path | None = None
) -> list[TaskPlan]:
    """Each benchmark's task, file and items (reads the data files: a missing one fails here,
    naming the command that prepares it)."""
    if not benchmarks:
        raise ValueError("no benchmarks to evaluate")
    root = data_root if data_root is not None else settings.data_root
    plans = []
    for name in benchmarks:
        task = task_name(name)
        if name in TINY_BENCHMARKS:
            rows = read_tiny_eval(name)
            indices = tiny_item_indices(rows, settings.limit)
            data_file = TINY_EVAL_DIR / f"{name}.jsonl"
            kind, label = "tiny", _tiny_label(settings.limit, len(indices))
        else:
            rows = read_benchmark(name, root)
            n = len(rows) if settings.limit is None else min(settings.limit, len(rows))
            indices = list(range(n))
            data_file = benchmark_path(name, root)
            kind = "math"
            label = f"the first {n} of {len(rows)} problems" if n < len(rows) else f"all {n}"
        subset = None if len(indices) == len(rows) else indices
        plans.append(TaskPlan(name, task, kind, data_file.resolve(), subset, len(indices), label))
    return plans


def generation_kwargs(settings: LmEvalSettings, plan: TaskPlan) -> dict[str, Any]:
    """The tasks' ``generation_kwargs``: greedy, or sampling at ``temperature``/``top_p``
    over the whole vocabulary (``top_k: 0`` for transformers, whose default is 50), stopping
    at EOS only (``until: []``; lm-eval adds the EOS string)."""
    out: dict[str, Any] = {
        "until": [],
        "max_gen_toks": settings.max_gen_toks or plan.max_gen_toks,
    }
    if settings.greedy:
        return {**out, "do_sample": False, "temperature": 0.0}
    out.update(do_sample=True, temperature=settings.temperature, top_p=settings.top_p)
    if settings.engine == "hf":
        out["top_k"] = 0  # transformers' GenerationConfig samples from the top 50 otherwise
    return out


def write_task_dir(
    plans: Sequence[TaskPlan],
    settings: LmEvalSettings,
    directory: str | Path,
    *,
    cache_dir: str | Path | None = None,
) -> Path:
    """One task YAML per plan in ``directory`` (created; old YAMLs replaced): the committed
    task included, the data file by absolute path, ``repeats: k``, the generation settings;
    ``cache_dir``: where ``datasets`` keeps its Arrow copy of the JSON (default: its own
    cache). Returns the directory (lm-eval's ``--include_path``)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for old in directory.glob("*.yaml"):
        old.unlink()
    for plan in plans:
        task = {
            "task": plan.task,
            "include": str(TASKS_DIR / f"{plan.task}.yaml"),
            "dataset_kwargs": {"data_files": {"test": str(plan.data_file)}},
            "repeats": settings.k,
            "generation_kwargs": generation_kwargs(settings, plan),
        }
        if cache_dir is not None:
            task["dataset_kwargs"]["cache_dir"] = str(cache_dir)
        text = yaml.safe_dump(task, sort_keys=False)
        atomic_write_text(directory / f"{plan.task}.yaml", text, durable=False)
    return directory


def model_args(settings: LmEvalSettings, checkpoint: str | Path) -> dict[str, Any]:
    """lm-eval's ``model_args`` for the engine (``--model hf`` or ``--model vllm``); the hf
    model's device goes separately (lm-eval's ``--device``: in both places it is an error)."""
    pretrained = str(Path(checkpoint).resolve())
    if settings.engine == "hf":
        return {"pretrained": pretrained, "dtype": settings.dtype}
    args: dict[str, Any] = {
        "pretrained": pretrained,
        "dtype": settings.dtype,
        "tensor_parallel_size": settings.tensor_parallel_size,
        "gpu_memory_utilization": settings.gpu_memory_utilization,
        "seed": settings.seed,
    }
    if settings.quantization is not None:
        args["quantization"] = settings.quantization
    if settings.max_model_len is not None:
        args["max_model_len"] = settings.max_model_len
    return args


def _samples_arg(plans: Sequence[TaskPlan]) -> dict[str, list[int]] | None:
    chosen = {p.task: p.indices for p in plans if p.indices is not None}
    return chosen or None


def lm_eval_command(
    settings: LmEvalSettings,
    checkpoint: str | Path,
    task_dir: str | Path,
    plans: Sequence[TaskPlan],
    output_path: str | Path,
) -> list[str]:
    """The ``lm_eval`` command line equivalent to :func:`run_lm_eval`'s call (for a GPU
    node's shell, or to reproduce a number by hand; lm-eval writes its results and samples
    under ``output_path``)."""
    margs = ",".join(f"{k}={v}" for k, v in model_args(settings, checkpoint).items())
    batch = "auto" if settings.engine == "vllm" else str(settings.batch_size)
    seed = settings.seed
    cmd = [
        "lm_eval",
        "--model", settings.engine,
        "--model_args", margs,
        "--include_path", str(task_dir),
        "--tasks", ",".join(p.task for p in plans),
        "--batch_size", batch,
        "--seed", f"{seed},{seed},{seed},{seed}",
        "--log_samples",
    ]  # fmt: skip
    if settings.engine == "hf":
        cmd += ["--device", settings.device]
    samples = _samples_arg(plans)
    if samples is not None:
        cmd += ["--samples", json.dumps(samples, separators=(",", ":"))]
    if settings.chat_template:
        cmd.append("--apply_chat_template")
    return [*cmd, "--output_path", str(output_path)]


def settings_fingerprint(settings: LmEvalSettings, plans: Sequence[TaskPlan]) -> str:
    """16 hex digits over what determines an evaluation's numbers: the engine, dtype,
    quantisation, sampling, token budget, seed, chat template, each task's items and data
    file contents, the task files' version and lm-eval's. Not batch size, device or GPU
    settings (where they change numbers at all, it is by floating-point noise)."""
    s = settings
    what = {
        "engine": s.engine,
        "dtype": s.dtype,
        "quantization": s.quantization,
        "k": s.k,
        "greedy": s.greedy,
        "temperature": None if s.greedy else s.temperature,
        "top_p": None if s.greedy else s.top_p,
        "max_model_len": s.max_model_len,
        "seed": s.seed,
        "chat_template": s.chat_template,
        "tasks": [
            [p.task, generation_kwargs(s, p)["max_gen_toks"], p.indices, file_sha256(p.data_file)]
            for p in plans
        ],
        "tasks_version": TASKS_VERSION,
        "lm_eval": version("lm-eval"),
    }
    text = json.dumps(what, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass
class EvalOutcome:
    """What one evaluation produced: store-named metrics, per-problem records, timing."""

    metrics: dict[str, float]
    records: list[dict[str, Any]] = field(default_factory=list)  # one per (benchmark, problem)
    seconds: float = 0.0
    problems: int = 0
    out_dir: Path | None = None

    @property
    def problems_per_s(self) -> float:
        return self.problems / self.seconds if self.seconds else float("nan")


def _store_metrics(plans: Sequence[TaskPlan], results: dict[str, Any], k: int) -> dict[str, float]:
    out: dict[str, float] = {}
    names = {"acc": ("val-core", "acc/mean"), "pass_at_k": ("val-aux", "acc/pass"),
             "boxed": ("val-aux", "boxed/mean")}  # fmt: skip
    for plan in plans:
        task = results[plan.task]
        for metric, (section, stat) in names.items():
            out[f"{section}/{plan.benchmark}/{stat}@{k}"] = float(task[f"{metric},keep_all"])
    for section, stat in names.values():
        values = [out[f"{section}/{p.benchmark}/{stat}@{k}"] for p in plans]
        out[f"{section}/all/{stat}@{k}"] = sum(values) / len(values)
    return out


def _records(plans: Sequence[TaskPlan], samples: dict[str, list[dict]]) -> list[dict[str, Any]]:
    out = []
    for plan in plans:
        for sample in samples[plan.task]:
            doc = sample["doc"]
            out.append(
                {
                    "benchmark": plan.benchmark,
                    "id": doc["id"],
                    "responses": list(sample["filtered_resps"][0]),
                    "acc": float(sample["acc"]),
                    "pass": float(sample["pass_at_k"]),
                }
            )
    return out


def _write_samples(out_dir: Path, samples: dict[str, list[dict]]) -> None:
    for task, rows in samples.items():
        text = "".join(json.dumps(r, default=str, ensure_ascii=False) + "\n" for r in rows)
        atomic_write_text(out_dir / f"samples_{task}.jsonl", text)


def run_lm_eval(
    checkpoint: str | Path,
    benchmarks: Sequence[str],
    settings: LmEvalSettings,
    out_dir: str | Path,
    *,
    plans: Sequence[TaskPlan] | None = None,
) -> EvalOutcome:
    """Evaluate ``checkpoint`` (an HF directory) on ``benchmarks`` with lm-eval; write the
    task files, the command, lm-eval's results and per-sample logs into ``out_dir``."""
    import lm_eval  # heavy (datasets, evaluate, sacrebleu): imported when used
    from lm_eval.tasks import TaskManager

    if settings.engine == "vllm" and importlib.util.find_spec("vllm") is None:
        raise RuntimeError(
            "lm_eval.engine=vllm needs vLLM, which only a GPU node has (pip install -r "
            "requirements-cluster.txt there; docs/evaluation.md, 'On a GPU node'); on this "
            "machine use lm_eval.engine=hf"
        )
    checkpoint = Path(checkpoint)
    if not (checkpoint / "config.json").is_file():
        raise FileNotFoundError(f"no HF checkpoint at {checkpoint} (config.json missing)")
    _check_stops_at_eos(checkpoint, settings)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    plans = list(plans) if plans is not None else plan_tasks(benchmarks, settings)
    cache = out_dir / ".datasets_cache"  # datasets' Arrow copy of the JSON, removed afterwards
    task_dir = write_task_dir(plans, settings, out_dir / "tasks", cache_dir=cache)
    command = shlex.join(lm_eval_command(settings, checkpoint, task_dir, plans, out_dir / "cli"))
    atomic_write_text(out_dir / "command.txt", command + "\n", durable=False)
    log.info("lm-eval: %s", command)
    manager = TaskManager(include_path=str(task_dir), include_defaults=False)
    seed = settings.seed
    t0 = time.perf_counter()
    try:
        results = lm_eval.simple_evaluate(
            model=settings.engine,
            model_args=model_args(settings, checkpoint),
            tasks=[p.task for p in plans],
            task_manager=manager,
            batch_size="auto" if settings.engine == "vllm" else settings.batch_size,
            device=settings.device if settings.engine == "hf" else None,
            samples=_samples_arg(plans),
            log_samples=True,
            apply_chat_template=settings.chat_template,
            random_seed=seed,
            numpy_random_seed=seed,
            torch_random_seed=seed,
            fewshot_random_seed=seed,
        )
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    seconds = time.perf_counter() - t0
    if results is None:  # a non-zero rank of a distributed run
        raise RuntimeError("lm-eval returned no results (not rank 0?)")
    samples = results.pop("samples")
    _write_samples(out_dir, samples)
    text = json.dumps(results, indent=2, default=str, sort_keys=True) + "\n"
    atomic_write_text(out_dir / "results.json", text)
    metrics = _store_metrics(plans, results["results"], settings.k)
    problems = sum(p.n_items for p in plans)
    return EvalOutcome(metrics, _records(plans, samples), seconds, problems, out_dir)


def _check_stops_at_eos(checkpoint: Path, settings: LmEvalSettings) -> None:
    """transformers' generate stops a row at EOS only when the checkpoint's generation
    config names an eos id; without one, the text after EOS reaches the checker."""
    if settings.engine != "hf":
        return
    found = None
    for name in ("generation_config.json", "config.json"):
        path = checkpoint / name
        if path.is_file():
            found = found if found is not None else json.loads(path.read_text()).get("eos_token_id")
    if found is None:
        raise ValueError(
            f"{checkpoint}: neither generation_config.json nor config.json names an "
            "eos_token_id, so transformers' generate would not stop at EOS; re-export it "
            "(fp8rl.world.export writes the tokenizer's ids) or add eos_token_id to "
            "generation_config.json"
        )
