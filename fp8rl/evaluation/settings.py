"""The ``lm_eval`` settings: how ``sweep.py --eval`` evaluates a run's exported checkpoints.

A group of the experiment tree (``lm_eval.k=4``, ``lm_eval.engine=vllm``) that is never part
of a run id: evaluating a finished run does not change what it computed. Declared once here
with the config's field helpers (:mod:`fp8rl.config.fields`) and checked when built.
"""

from __future__ import annotations

from dataclasses import dataclass

from fp8rl.config.fields import ConfigError, check_fields, choice, num
from fp8rl.config.run import MAX_BATCH, MAX_NEW_TOKENS, MAX_TEMPERATURE
from fp8rl.evaluation.benchmarks import BENCHMARKS, TINY_BENCHMARKS

__all__ = ["DTYPES", "ENGINES", "QUANTIZATIONS", "STEPS", "LmEvalSettings"]

#: lm-eval model backends: transformers (CPU or GPU) and vLLM (GPU only).
ENGINES = ("hf", "vllm")
#: The dtype the checkpoint is served in (weights and activations).
DTYPES = ("bfloat16", "float32", "float16")
#: vLLM's online quantisation of the served weights (``fp8``: E4M3 W8A8, dynamic scales).
QUANTIZATIONS = ("fp8",)
#: Which exported checkpoints of a run to evaluate.
STEPS = ("all", "last")


@dataclass
class LmEvalSettings:
    """lm-eval over a run's exported checkpoints (``<run>/hf/step_<n>/``).

    engine: ``hf`` (transformers; this CPU or a GPU) or ``vllm`` (a GPU node). The same
        task files either way.
    benchmarks: lm-eval benchmarks by name (null: the run's own: its ``eval.families`` on
        the tiny backend, ``fp8rl.evaluation.benchmarks.SUITE`` otherwise).
    k samples per problem (``repeats``, every sample scored: avg@k and pass@k), greedy or
        at ``temperature``/``top_p``; ``max_gen_toks`` new tokens (null: on a tiny run its
        ``eval.max_new_tokens``, as the in-loop evaluator; else the task's own: 80 for the
        tiny families, 4096 for math).
    limit: problems per benchmark (null: all): on a tiny family the in-loop evaluator's
        sample stratified by difficulty, on a math benchmark its first ``limit`` problems.
    dtype the checkpoint is served in; ``quantization=fp8``: vLLM's online FP8 (E4M3
        weights and dynamic activation scales), the paper's FP8 rollout engine.
    batch_size (hf), device (hf: ``cpu``, ``cuda``, ``cuda:0``; vLLM picks GPUs from
        ``CUDA_VISIBLE_DEVICES``), tensor_parallel_size, gpu_memory_utilization and
        max_model_len (vLLM). seed: lm-eval's seeds and vLLM's sampling seed.
    steps: ``all`` exported checkpoints, or the ``last``. data_root: prepared benchmark
        files (null: ``data/benchmarks``). chat_template: wrap prompts in the tokenizer's
        chat template (instruct models; off for base models and the tiny ones).
    """

    engine: str = choice("hf", ENGINES)
    benchmarks: list[str] | None = None
    k: int = num(1, ge=1, le=1024)  # samples per problem (avg@32 is the paper's)
    greedy: bool = True
    temperature: float = num(1.0, gt=0.0, le=MAX_TEMPERATURE)
    top_p: float = num(1.0, gt=0.0, le=1.0)
    max_gen_toks: int | None = num(
        None, ge=1, le=MAX_NEW_TOKENS, null="a tiny run's eval.max_new_tokens, else the task's"
    )
    # problems per benchmark: a million is more than any benchmark here holds
    limit: int | None = num(None, ge=1, le=1_000_000, null="every problem")
    dtype: str = choice("bfloat16", DTYPES)
    quantization: str | None = choice(None, QUANTIZATIONS, null="no quantisation")
    batch_size: int = num(64, ge=1, le=MAX_BATCH)
    device: str = "cpu"
    tensor_parallel_size: int = num(1, ge=1, le=64)  # GPUs of one vLLM engine (8 a node)
    gpu_memory_utilization: float = num(0.85, gt=0.0, le=1.0)
    # tokens of prompt and answer: 1M is past any context of the models here
    max_model_len: int | None = num(None, ge=1, le=1_048_576, null="the model's")
    seed: int = num(0, ge=0)
    steps: str = choice("all", STEPS)
    data_root: str | None = None
    chat_template: bool = False

    def __post_init__(self) -> None:
        check_fields(self, "lm_eval")
        if self.greedy and self.k != 1:
            raise ConfigError(
                f"lm_eval.k={self.k} with lm_eval.greedy=true gives k identical samples: "
                "set lm_eval.k=1 or lm_eval.greedy=false"
            )
        if self.quantization is not None and self.engine != "vllm":
            raise ConfigError(
                f"lm_eval.quantization={self.quantization} is vLLM's online quantisation: set "
                "lm_eval.engine=vllm (a GPU node), or lm_eval.quantization=null"
            )
        if self.benchmarks is not None:
            known = (*TINY_BENCHMARKS, *BENCHMARKS)
            unknown = [b for b in self.benchmarks if b not in known]
            if unknown or not self.benchmarks:
                raise ConfigError(
                    f"lm_eval.benchmarks={self.benchmarks}: "
                    + (f"{unknown} unknown" if unknown else "names no benchmark")
                    + f"; known: {list(known)} (or null: the run's own)"
                )

    @property
    def engine_label(self) -> str:
        """What every stored row's ``engine`` says: ``lm-eval/hf`` or ``lm-eval/vllm``."""
        return f"lm-eval/{self.engine}"

    @property
    def precision(self) -> str:
        """What the served model computes in: the dtype, or ``fp8`` under vLLM's FP8."""
        return "fp8" if self.quantization else self.dtype
