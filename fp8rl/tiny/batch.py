"""One step's rollout data as typed objects: sampled :class:`Response` s and the padded
:class:`StepBatch` every forward of the step reads.

``sample_responses`` is one rollout round (problems drawn with a seed, ``n_samples``
responses each, scored by the outcome reward plus DAPO's overlong shaping); ``pad`` lays
responses out as prompt + response rows for one ordinary forward.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from fp8rl.config import RunConfig
from fp8rl.rewards import reward
from fp8rl.rl import overlong_penalty
from fp8rl.sampling.sampler import Sampler, response_inputs, response_log_probs
from fp8rl.tiny.packing import PackedRows, pack_rows, packed_log_probs
from fp8rl.world.evaluate import repeat_4gram_frac
from fp8rl.world.prompts import step_problems
from fp8rl.world.tasks import Problem
from fp8rl.world.tokenizer import EOS_ID, PAD_ID

__all__ = ["Response", "Rows", "StepBatch", "pad", "repeat_4gram_frac", "sample_responses"]


@dataclass
class Response:
    """One sampled response to one problem, scored."""

    problem: Problem
    group: str  # the prompt's group (GRPO normalises advantages within it)
    prompt: list[int]
    tokens: list[int]
    logprob: torch.Tensor  # the rollout engine's log-probs of ``tokens``
    finished: bool  # ended on EOS (False: truncated at max_new_tokens)
    text: str
    acc: float  # outcome reward: 1 if the boxed answer is right
    score: float  # acc plus DAPO's overlong shaping, when on


@dataclass
class StepBatch:
    """Responses padded to one (B, P + T) layout: the model inputs, the response tokens,
    their mask and the rollout's log-probs, (B, T)."""

    responses: list[Response]
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    prompt_width: int
    tokens: torch.Tensor
    mask: torch.Tensor
    rollout_log_prob: torch.Tensor

    def __len__(self) -> int:
        return len(self.responses)

    def forward_args(self, idx: torch.Tensor | slice, temperature: float) -> tuple:
        """The arguments of ``sampler.response_log_probs`` after the model, for rows ``idx``."""
        return (
            self.input_ids[idx],
            self.attention_mask[idx],
            self.position_ids[idx],
            self.prompt_width,
            self.tokens[idx],
            temperature,
        )

    def rows(self, idx: torch.Tensor | slice, temperature: float, packed: bool) -> Rows:
        """Rows ``idx`` for the training forwards: packed without padding
        (:mod:`fp8rl.tiny.packing`) or in the batch's padded layout."""
        return Rows(self.forward_args(idx, temperature), packed)

    @property
    def scores(self) -> torch.Tensor:
        return torch.tensor([r.score for r in self.responses])

    @property
    def groups(self) -> list[str]:
        return [r.group for r in self.responses]

    def token_rewards(self) -> torch.Tensor:
        """(B, T) with each response's score on its last token (the outcome reward)."""
        B, lengths = len(self), self.mask.sum(1)
        out = torch.zeros(B, self.tokens.shape[1])
        out[torch.arange(B), (lengths - 1).clamp(min=0)] = self.scores
        return out


class Rows:
    """Some rows of a :class:`StepBatch` laid out for the training forwards: ``log_probs``
    is ``response_log_probs`` on them, packed (the layout built once, on first use) or
    padded."""

    def __init__(self, args: tuple, packed: bool) -> None:
        self.args, self.packed = args, packed
        self._pack: PackedRows | None = None

    def log_probs(self, model: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
        """``(log_prob, entropy)`` of the rows' response tokens, each ``(rows, T)``."""
        if not self.packed:
            return response_log_probs(model, *self.args)
        if self._pack is None:
            input_ids, attn, position_ids, width, tokens, _ = self.args
            mask = attn[:, width:].bool()
            self._pack = pack_rows(input_ids, attn, position_ids, width, tokens, mask)
        return packed_log_probs(model, self._pack, self.args[-1])


def pad(
    prompts: Sequence[list[int]],
    responses: Sequence[list[int]],
    logprobs: Sequence[torch.Tensor],
    rows: list[Response] | None = None,
) -> StepBatch:
    """Lay out prompt + response rows (responses right-padded to the longest)."""
    T = max(max(map(len, responses)), 1)
    B = len(prompts)
    tokens = torch.full((B, T), PAD_ID, dtype=torch.long)
    mask = torch.zeros(B, T, dtype=torch.bool)
    lp = torch.zeros(B, T)
    for i, (r, q) in enumerate(zip(responses, logprobs, strict=True)):
        tokens[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        mask[i, : len(r)] = True
        lp[i, : len(r)] = q
    input_ids, attn, position_ids, P = response_inputs(prompts, tokens, mask, PAD_ID)
    return StepBatch(rows or [], input_ids, attn, position_ids, P, tokens, mask, lp)


def pad_responses(rows: list[Response]) -> StepBatch:
    return pad([r.prompt for r in rows], [r.tokens for r in rows], [r.logprob for r in rows], rows)


def sample_responses(
    cfg: RunConfig, sampler: Sampler, tokenizer: Any, seed: int, group_prefix: str = ""
) -> list[Response]:
    """One round of rollouts: ``rollout.prompts_per_step`` training problems drawn with
    ``seed``, ``rollout.n_samples`` responses each, grouped by prompt."""
    r = cfg.rollout
    problems = step_problems(cfg, seed)
    prompts = [tokenizer.encode(p.prompt) for p in problems for _ in range(r.n_samples)]
    batch = sampler.generate(
        prompts, max_new_tokens=r.max_new_tokens, temperature=r.temperature, seed=seed
    )
    out = []
    for i, prompt in enumerate(prompts):
        problem = problems[i // r.n_samples]
        n = int(batch.mask[i].sum())
        tokens = batch.tokens[i, :n].tolist()
        text = tokenizer.decode([t for t in tokens if t != EOS_ID])
        acc = reward(text, problem.answer)
        score = acc
        if cfg.overlong_buffer is not None:  # DAPO's overlong shaping
            score += float(
                overlong_penalty(
                    torch.tensor(n),
                    r.max_new_tokens,
                    cfg.overlong_buffer,
                    cfg.algorithm.overlong_penalty_factor,
                )
            )
        group = f"{group_prefix}{i // r.n_samples}"
        finished = bool(batch.finished[i])
        out.append(
            Response(
                problem, group, prompt, tokens, batch.logprobs[i, :n], finished, text, acc, score
            )
        )
    return out
