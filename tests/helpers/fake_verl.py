"""A stand-in for ``python -m verl.trainer.main_ppo <overrides>`` on a machine without GPUs:
it reads the overrides the verl backend passes, then writes what verl's V1 trainer writes —
metrics and validations through verl's own ``FileLogger`` at ``VERL_FILE_LOGGER_PATH``
(step 0 when ``trainer.val_before_train``, validations every ``trainer.test_freq`` steps and
at the last, as ``PPOTrainer.fit`` logs them), a rollout dump per step through verl's own
``_write_generations`` into ``trainer.rollout_data_dir`` — and checks the data files exist.
Both are verl's source run without importing verl (a second, not ~10 s:
tests/helpers/verl_source.py). ``FAKE_VERL_FAIL_AFTER=<n>`` exits 1 after step n."""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import orjson
from verl_source import verl_class, verl_function


def main(argv: list[str]) -> int:
    assert argv[:2] == ["-m", "verl.trainer.main_ppo"], argv
    ov = dict(a.lstrip("+").split("=", 1) for a in argv[2:])
    steps, every = int(ov["trainer.total_training_steps"]), int(ov["trainer.test_freq"])
    assert Path(ov["data.train_files"]).is_file()
    val_files = [v for v in ov["data.val_files"].strip("[]").split(",") if v]
    benchmarks = [Path(v).stem.removeprefix("val_") for v in val_files]
    k = ov.get("actor_rollout_ref.rollout.val_kwargs.n", "1")
    fail_after = int(os.environ.get("FAKE_VERL_FAIL_AFTER", "0"))
    dump = verl_function("trainer/ppo/v1/trainer_base.py", "PPOTrainer", "_write_generations")
    file_logger = verl_class("utils/tracking.py", "FileLogger", orjson=orjson)
    tracking = file_logger("fp8rl", ov["trainer.experiment_name"])

    def validation(step: int) -> dict[str, float]:
        return {f"val-core/{b}/acc/mean@{k}": 0.1 * step for b in benchmarks}

    if ov.get("trainer.val_before_train") == "true":
        tracking.log(data=validation(0), step=0)
    for step in range(1, steps + 1):
        metrics = {
            "actor/entropy": 1.0 / step,
            "critic/score/mean": 0.1 * step,
            "timing_s/step": 1.0,
        }
        if every > 0 and (step % every == 0 or step == steps):
            metrics.update(validation(step))
        if ov.get("trainer.rollout_data_dir", "null") != "null":
            n = int(ov["actor_rollout_ref.rollout.n"])
            rows = range(2 * n)
            prompts, gts = [f"q{i // n}" for i in rows], ["0"] * len(rows)
            answers = [f"\\boxed{{{i % 2}}}" for i in rows]
            scores = [float(i % 2 == 0) for i in rows]
            dump(prompts, answers, gts, scores, {}, ov["trainer.rollout_data_dir"], step)
        tracking.log(data=metrics, step=step)
        if step == fail_after:
            print(f"fake verl: crashing after step {step}", file=sys.stderr)
            return 1
    tracking.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
