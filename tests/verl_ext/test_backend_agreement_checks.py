"""fp8rl.verl_ext.agreement's checks on hand-made run files (no run): what is exact, what is
close, and that each can fail."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from fp8rl.verl_ext.agreement import TOLERANCES, compare_runs, failures


def token(ratio: float, adv: float, old: float = -1.0) -> dict:
    low, high = adv < 0 and ratio < 0.98, adv > 0 and ratio > 1.02
    return {"rollout_log_prob": -1.0, "old_log_prob": old, "ratio": ratio, "advantage": adv,
            "clipped_low": low, "clipped_high": high}  # fmt: skip


def write_run(path: Path, ratios: list[float], *, response=(5, 6, 7), metrics=None,
              clip_low: float = 0.98, old: float = -1.0) -> Path:  # fmt: skip
    (path / "samples").mkdir(parents=True)
    samples = [{"row": r, "prompt_ids": [1, 2], "response_ids": list(response), "score": -0.5,
                "finished": True, "tokens": [token(x, -1.0 if r else 1.0, old) for x in ratios]}
               for r in range(2)]  # fmt: skip
    dump = {"clip_low": clip_low, "clip_high": 1.02, "batch_size": 2, "mini_batches": 1,
            "samples": samples}  # fmt: skip
    (path / "samples" / "step_00000001.json").write_text(json.dumps(dump))
    data = {"critic/score/mean": -0.5, "critic/score/max": -0.5, "critic/score/min": -0.5,
            "actor/pg_loss": 0.3, "actor/grad_norm": 1.0, "actor/ppo_kl": 0.07,
            "actor/pg_clipfrac": 0.4, "actor/pg_clipfrac_lower": 0.0,
            "fp8rl/clipfrac_low_negadv": 0.5, "fp8rl/clipfrac_low_posadv": 0.25,
            "fp8rl/clipfrac_high_negadv": 0.2, "fp8rl/clipfrac_high_posadv": 0.5,
            "fp8rl/clip_low": clip_low, "fp8rl/clip_high": 1.02, **(metrics or {})}  # fmt: skip
    (path / "metrics.jsonl").write_text(json.dumps({"step": 1, "data": data}) + "\n")
    (path / "config.yaml").write_text("granularity:\n  training: bf16\n")
    return path


def names(checks) -> set[str]:
    return {c.name for c in failures(checks)}


def test_runs_that_agree_pass_and_each_kind_of_difference_fails(tmp_path: Path) -> None:
    tol = TOLERANCES["bf16"]
    tiny = write_run(tmp_path / "t", [0.97, 1.0, 1.03])
    same = write_run(tmp_path / "v", [0.97, 1.0, 1.03 * math.exp(tol.ratio / 2)],
                     metrics={"actor/grad_norm": 1.0 + tol.update_rel / 2},
                     old=-1.0 + tol.forward / 2)  # fmt: skip
    assert failures(compare_runs(tiny, same, weights=False)) == []
    sampled = write_run(tmp_path / "s", [0.97, 1.0, 1.03], response=(5, 6, 8))
    assert "samples: response_ids" in names(compare_runs(tiny, sampled, weights=False))
    forward = write_run(tmp_path / "f", [0.97, 1.0, 1.03], old=-1.0 + 2 * tol.forward)
    assert names(compare_runs(tiny, forward, weights=False)) == {"per-token old_log_prob"}
    update = write_run(tmp_path / "u", [0.97, 1.0, 1.03],
                       metrics={"actor/pg_loss": 0.3 * (1 + 2 * tol.update_rel)})  # fmt: skip
    assert names(compare_runs(tiny, update, weights=False)) == {"actor/pg_loss"}
    shares = write_run(tmp_path / "c", [0.97, 1.0, 1.03],
                       metrics={"fp8rl/clipfrac_low_negadv": 0.5 + 2 * tol.share})  # fmt: skip
    assert names(compare_runs(tiny, shares, weights=False)) == {"fp8rl/clipfrac_low_negadv"}
    wider = write_run(tmp_path / "w", [0.97, 1.0, 1.03], clip_low=0.97)  # eps_low + 0.01
    assert {"dump clip_low", "fp8rl/clip_low"} <= names(compare_runs(tiny, wider, weights=False))
    flips = write_run(tmp_path / "x", [0.99, 1.0, 1.03])  # 0.97 -> 0.99: unclipped on one side
    assert "per-token clip flags" in names(compare_runs(tiny, flips, weights=False))


def test_a_missing_dump_says_which_option_writes_it(tmp_path: Path) -> None:
    tiny = write_run(tmp_path / "t", [1.0])
    with pytest.raises(FileNotFoundError, match="dump_samples_every"):
        compare_runs(tiny, tmp_path, weights=False)


def _record(arm: str, ok: bool, control_failed: list[str]) -> dict:
    return {
        "arm": arm, "overrides": ["granularity=bf16"], "recipe": "bf16",
        "checks": [{"name": "samples: response_ids", "kind": "exact", "ok": ok,
                    "detail": "16/16 rows equal | none differ"}],
        "control_failed": control_failed,
        "floor": {"grad_rel": 0.00123456, "update_rel": 0.5, "log_prob_max": 1.5e-7},
        "runs": {"tiny": "a" * 16, "control": "b" * 16, "verl": "c" * 16},
        "wall_s": {"tiny": 1.4, "verl": 160.6}, "date": "2026-12-07", "cpu": "AMD EPYC",
        "cores": 2,
    }  # fmt: skip


def test_the_report_renders_each_arms_record() -> None:
    """The agreement report (the verl_agreement study's, regenerated from results/) is a
    function of the stored records: verdict, checks, the control, the noise floor."""
    from fp8rl.verl_ext.agreement import agreement_markdown

    text = agreement_markdown([_record("bf16", True, ["samples: response_ids"])])
    assert "from runs of 2026-12-07 on AMD EPYC (2 cores)" in text
    assert "## `granularity=bf16`: agree" in text
    assert f"tiny run `{'a' * 16}` 1 s, verl run `{'c' * 16}` 161 s" in text
    assert "| samples: response_ids | exact | yes | 16/16 rows equal \\| none differ |" in text
    assert "fails: `samples: response_ids`" in text
    assert "gradients 0.00123 apart (relative L2), updates 0.5, log-probs" in text
    bad = agreement_markdown([_record("bf16", False, [])])
    assert ": DISAGREE" in bad and "| **no** |" in bad
    assert "**nothing (the test fails)**" in bad
    with pytest.raises(ValueError, match="no agreement records"):
        agreement_markdown([])
