"""Token dumps of a verl run, written by fp8rl's actor in the tiny backend's format.

verl's rollout dumps hold text; the rollout engine knows neither the ratio PPO clipped nor
the bounds. fp8rl's actor (``fp8rl.verl_ext.calibrated_actor.Fp8rlTrainingWorker``) has both:
on every ``train.dump_samples_every``-th step its update batch holds each row's prompt and
response tokens, rollout and trainer log-probs, entropy (verl's old-log-prob pass), advantage,
token scores, ``extra_info`` and ground truth, and each PPO visit's log-probs pass through the
loss. A :class:`TokenDump` keeps, per row, the log-probs of its last visit, its mini-batch and
whether that visit followed an update, and :meth:`TokenDump.write` writes
``<run>/verl/token_dumps/step_<8 digits>.json`` in the tiny backend's ``samples/`` format
(``fp8rl.tiny.train.dump_samples``: the same rows chosen the same way,
``fp8rl.rl.step_metrics.dump_rows``, tokens by ``fp8rl.rl.step_metrics.token_records``), which
ingestion copies into ``samples/`` (``fp8rl.verl_ext.ingest``), so the token viewer shows a
verl run as it shows a tiny one.

The worker learns what to dump from :data:`ENV_VAR` (JSON: :class:`DumpSpec`), which the
translation sets for every Ray worker (torch is imported where the dump is
made, not with the module). With several data-parallel ranks each rank holds part of the
batch: rank 0 gathers every rank's rows (``all_gather_object``) and writes the file.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fp8rl.runs import atomic_write_text

if TYPE_CHECKING:
    import torch

__all__ = ["DIRECTORY", "ENV_VAR", "DumpSpec", "TokenDump", "dump_path", "dump_steps"]

logger = logging.getLogger(__name__)

#: The dump spec of a run's workers (JSON of :class:`DumpSpec`; unset: no token dumps).
ENV_VAR = "FP8RL_TOKEN_DUMPS"


@dataclass(frozen=True)
class DumpSpec:
    """Where and what the actor dumps: every ``every``-th step, ``k`` responses, decoded
    with the tokenizer at ``tokenizer``; ``header`` the run-level fields of each file (the
    loss, the old-log-prob source, the TIS threshold)."""

    directory: str
    every: int
    k: int
    tokenizer: str
    header: dict[str, Any] = field(default_factory=dict)

    def to_env(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> DumpSpec | None:
        raw = (os.environ if env is None else env).get(ENV_VAR)
        return None if not raw else cls(**json.loads(raw))

    def wants(self, step: int | None) -> bool:
        return step is not None and self.every > 0 and step % self.every == 0


#: The token dumps' folder in a run's ``verl/`` directory (``RunFiles.token_dumps``).
DIRECTORY = "token_dumps"


def dump_path(directory: str | Path, step: int) -> Path:
    return Path(directory) / f"step_{step:08d}.json"


def dump_steps(directory: str | Path) -> dict[int, Path]:
    """The token dumps in ``directory`` by step (none if it does not exist)."""
    directory = Path(directory)
    if not directory.is_dir():
        return {}
    found = {int(p.stem[5:]): p for p in directory.glob("step_*.json") if p.stem[5:].isdigit()}
    return {step: path for step, path in found.items() if path == dump_path(directory, step)}


def _rows_of(nested: Any) -> list[torch.Tensor]:
    """A nested (jagged) or padded tensor's rows, each a 1-d tensor of its own length."""
    if getattr(nested, "is_nested", False):
        return [t.detach().cpu() for t in nested.unbind()]
    return [t.detach().cpu() for t in nested]


def _non_tensor(data: Any, key: str, n: int) -> list[Any]:
    try:
        values = data[key]
    except KeyError:
        return [None] * n
    if isinstance(values, str):
        return [values] * n
    return list(values.tolist()) if hasattr(values, "tolist") else list(values)


class TokenDump:
    """One rank's rows of a dump step (the module docstring); ``data`` is the step's update
    batch as ``train_mini_batch`` receives it, before verl's mini-batch split."""

    def __init__(self, spec: DumpSpec, step: int, data: Any, bypass: bool) -> None:
        self.spec, self.step, self.bypass = spec, int(step), bool(bypass)
        n = int(data.shape[0])
        self.prompts = [p.tolist() for p in _rows_of(data["prompts"])]
        self.responses = [r.tolist() for r in _rows_of(data["responses"])]
        mask = _rows_of(data["response_mask"])
        self.lengths = [int(m.sum()) for m in mask]
        self.rollout_lp = (
            _rows_of(data["rollout_log_probs"]) if "rollout_log_probs" in data.keys() else None
        )
        self.old_lp = _rows_of(data["old_log_probs"])
        self.entropy = _rows_of(data["entropy"]) if "entropy" in data.keys() else None
        self.advantages = _rows_of(data["advantages"])
        self.scores = [float(s.sum()) for s in _rows_of(data["rm_scores"])] if (
            "rm_scores" in data.keys()) else [float("nan")] * n  # fmt: skip
        self.extra = _non_tensor(data, "extra_info", n)
        self.reward_model = _non_tensor(data, "reward_model", n)
        self.uids = _non_tensor(data, "uid", n)
        self.last_lp: list[torch.Tensor | None] = [None] * n
        self.minibatch = [-1] * n
        self.off_policy = [False] * n
        self.updates = 0
        self.mini_batches = 0
        self.bounds: tuple[float, float] = (float("nan"), float("nan"))

    # -- during the update
    def visit(self, rows: torch.Tensor) -> None:
        """A mini-batch visit of ``rows`` starts (before its forward)."""
        first_epoch = any(self.minibatch[int(r)] < 0 for r in rows.tolist())
        for r in rows.tolist():
            if self.minibatch[r] < 0:
                self.minibatch[r] = self.mini_batches
            self.off_policy[r] = self.updates > 0 or self.bypass
        if first_epoch:
            self.mini_batches += 1

    def visited(self) -> None:
        self.updates += 1

    def observe(self, data: Any, model_output: dict[str, Any]) -> None:
        """A micro-batch's log-probs as the loss receives them (``data`` carries the rows'
        indices, ``fp8rl.verl_ext.calibrated_actor.ROW_KEY``)."""
        from verl.workers.utils.padding import no_padding_2_padding

        from fp8rl.verl_ext.calibrated_actor import ROW_KEY

        lp = no_padding_2_padding(model_output["log_probs"], data).detach().float().cpu()
        for i, r in enumerate(data[ROW_KEY].tolist()):
            self.last_lp[r] = lp[i, : self.lengths[r]].clone()

    # -- after the update
    def rows(self, row_offset: int = 0) -> list[dict[str, Any]]:
        """This rank's rows as plain values (what rank 0 gathers)."""
        import torch

        out = []
        for i in range(len(self.prompts)):
            n = self.lengths[i]
            last = self.last_lp[i]
            if last is None:
                raise RuntimeError(f"token dump of step {self.step}: row {i} was never visited")
            rollout = self.rollout_lp[i][:n] if self.rollout_lp is not None else self.old_lp[i][:n]
            nan = torch.full((n,), float("nan"))
            entropy = self.entropy[i][:n] if self.entropy is not None else nan
            extra = self.extra[i] if isinstance(self.extra[i], dict) else {}
            gold = self.reward_model[i].get("ground_truth") if isinstance(
                self.reward_model[i], dict) else None  # fmt: skip
            out.append(
                {
                    "row": row_offset + i,
                    "uid": None if self.uids[i] is None else str(self.uids[i]),
                    "id": extra.get("id"),
                    "question": extra.get("question"),
                    "answer": gold,
                    "prompt_ids": self.prompts[i],
                    "response_ids": self.responses[i][:n],
                    "rollout_log_prob": rollout.tolist(),
                    "old_log_prob": self.old_lp[i][:n].tolist(),
                    "log_prob": last.tolist(),
                    "entropy": entropy.tolist(),
                    "advantage": self.advantages[i][:n].tolist(),
                    "score": self.scores[i],
                    "minibatch": self.minibatch[i],
                    "off_policy": self.off_policy[i],
                }
            )
        return out

    def write(self, rows: list[dict[str, Any]], tokenizer: Any, eos_id: int | None) -> Path:
        """The dump file of ``rows`` (every rank's, in batch order)."""
        import torch

        from fp8rl.rl.step_metrics import DUMP_FORMAT, dump_rows, token_records
        from fp8rl.verl_ext.reward import compute_score

        spec = self.spec
        ids = [str(r["id"] if r["id"] is not None else r["uid"]) for r in rows]
        first_adv = [r["advantage"][0] if r["advantage"] else 0.0 for r in rows]
        chosen = dump_rows(ids, first_adv, [r["off_policy"] for r in rows], spec.k)
        groups: dict[str, int] = {}
        for r in rows:
            groups.setdefault(str(r["uid"]), len(groups))
        texts = [[tokenizer.decode([t]) for t in rows[i]["response_ids"]] for i in chosen]
        width = max([len(rows[i]["response_ids"]) for i in chosen] or [0])

        def padded(key: str) -> torch.Tensor:
            out = torch.zeros(len(chosen), width)
            for j, i in enumerate(chosen):
                values = torch.tensor(rows[i][key], dtype=torch.float32)
                out[j, : len(values)] = values
            return out

        old, new = padded("old_log_prob"), padded("log_prob")
        per_token = token_records(
            texts, padded("rollout_log_prob"), old, new - old, padded("entropy"),
            padded("advantage"), *self.bounds, trainer_log_prob=old,
        )  # fmt: skip
        samples = []
        for i, tokens in zip(chosen, per_token, strict=True):
            r = rows[i]
            body = [t for t in r["response_ids"] if t != eos_id]
            text = tokenizer.decode(body)
            correct = None
            if r["answer"] is not None:
                correct = compute_score("", text, str(r["answer"]))["acc"] == 1.0
            finished = bool(r["response_ids"]) and r["response_ids"][-1] == eos_id
            samples.append(
                {"id": r["id"], "question": r["question"], "answer": r["answer"],
                 "response": text, "score": r["score"], "correct": correct,
                 "finished": finished, "row": r["row"], "group": f"0-{groups[str(r['uid'])]}",
                 "minibatch": r["minibatch"], "off_policy": r["off_policy"],
                 "prompt_ids": r["prompt_ids"], "response_ids": r["response_ids"],
                 "tokens": tokens}
            )  # fmt: skip
        dump = {
            "step": self.step,
            "format": DUMP_FORMAT,
            "clip_low": self.bounds[0],
            "clip_high": self.bounds[1],
            **spec.header,
            "batch_size": len(rows),
            "mini_batches": self.mini_batches,
            "source": "fp8rl actor (verl)",
            "samples": samples,
        }
        path = dump_path(spec.directory, self.step)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(dump, separators=(",", ":")) + "\n")
        logger.info("token dump of step %d: %d of %d rows -> %s", self.step, len(chosen),
                    len(rows), path)  # fmt: skip
        return path
