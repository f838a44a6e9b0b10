"""benchmarks/table2_compute.py: the benchmark command carries the study's scale settings,
and the re-estimate applies each arm's measured ratio to the study's recorded step time."""

from __future__ import annotations

import argparse
import importlib.util
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location(
    "table2_compute", REPO / "benchmarks" / "table2_compute.py"
)
t2 = importlib.util.module_from_spec(spec)
spec.loader.exec_module(t2)
bench = t2.bench_trainer  # the benchmark the script reads, loaded by the script


def test_the_bench_command_sets_the_studys_scale_values_as_yaml_reads_them() -> None:
    scale = yaml.safe_load((REPO / "experiments/conf/scale/tiny_table2.yaml").read_text())
    std, cc = t2.bench_command("7dbb020", REPO / "results" / "table2")
    args = shlex.split(std)
    sets = args[args.index("--set") + 1 : args.index("--json")]
    parsed = {k: yaml.safe_load(v) for k, v in (s.split("=", 1) for s in sets)}
    assert parsed["eval.every"] == 0 and "steps" not in parsed
    for key, value in parsed.items():  # every other value is the scale file's
        if key != "eval.every":
            section, _, name = key.rpartition(".")
            node = scale
            for part in section.split(".") if section else []:
                node = node[part]
            assert node[name] == value, key
    assert {"model.sft.steps", "train.lr", "train.shadow_every", "clipping.period"} <= set(parsed)
    assert isinstance(parsed["train.lr"], float)  # "3e-05" would be a string to YAML
    assert "clipping.mode=calibrated" in cc and "clipping.mode" not in std
    assert "--threads 1 " in std  # the study's runs ran on one thread each (provenance)


def fake_run(
    root: Path,
    name: str,
    training: str,
    rollout: str | None,
    mode: str,
    steps: list[float],
    wall_s: float,
    loss: str = "calibrated_clip",
) -> None:
    run = root / name
    run.mkdir(parents=True)
    cfg = {
        "granularity": {"training": training, "rollout": rollout},
        "clipping": {"mode": mode, "loss": loss, "lower_only": False},
    }
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    lines = [json.dumps({"step": i, "data": {"timing_s/step": s}}) for i, s in enumerate(steps)]
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    end = f"2026-12-01T10:{int(wall_s) // 60:02d}:{int(wall_s) % 60:02d}+00:00"
    status = {"status": "done", "attempt": 1, "started_at": "2026-12-01T10:00:00+00:00",
              "finished_at": end}  # fmt: skip
    (run / "status.json").write_text(json.dumps(status))
    prov = {"hardware": {"cpu_model": "Study CPU"}, "git": {"commit": "f4624b1f1d"}}
    (run / "provenance.json").write_text(json.dumps(prov))


def fake_bench(path: Path, mode: str, ratios: dict[str, float]) -> Path:
    """A JSON file as bench_trainer.py --against --json writes it (its own writer)."""
    runs = {
        t2.BENCH_RUN[r]: {"old": {"step": 2.0}, "new": {"step": 2.0 * x}} for r, x in ratios.items()
    }
    sets = [f"clipping.mode={mode}"] if mode != "standard" else []
    args = argparse.Namespace(threads=1, steps=4, repeats=1, sets=sets, json=path)
    bench.write_json(args, "aaa", "bbb", runs)
    return path


def test_the_reestimate_applies_each_arms_ratio_and_carries_the_rest(tmp_path) -> None:
    res = tmp_path / "results"
    # recorded: 300 s of steps in 400 s (BF16), 600 in 800 (rowwise CC), 100 in 200 (CISPO)
    fake_run(res, "a", "bf16", None, "standard", [100.0, 200.0], 400)
    fake_run(res, "b", "rowwise", "channel", "calibrated", [300.0, 300.0], 800)
    fake_run(res, "c", "rowwise", "channel", "standard", [100.0], 200, loss="fp8rl_cispo")
    std = fake_bench(tmp_path / "std.json", "standard", {"bf16": 0.8, "rowwise": 0.5})
    cc = fake_bench(tmp_path / "cc.json", "calibrated", {"rowwise": 0.25})
    out = t2.report(res, [std, cc])
    # steps: 300*0.8 + 600*0.25 + 100*0.5 = 440 of 1000; not step time: median share of
    # (0.25, 0.25, 0.5) = 0.25 -> the study 1000/0.75 = 1333.3 s, 333.3 s of it carried
    assert "| **steps, all arms** | 3 | 0.28 | 0.44x | 0.12 |" in out
    assert "**0.58x**" in out  # (440 + 333.3) / 1333.3
    assert "recorded on Study CPU, code f4624b1" in out and bench.cpu_name() in out
    assert "rowwise + channel rollout, standard clipping, fp8rl_cispo | 1 | 0.03 | 0.50x " in out
    assert "(rowwise, standard), the nearest recipe" in out
    assert "(rowwise, calibrated) |" in out  # the exact recipe: not marked


def test_an_arm_without_a_measured_ratio_is_refused(tmp_path) -> None:
    res = tmp_path / "results"
    fake_run(res, "a", "blockwise", "block", "standard", [10.0], 20)
    std = fake_bench(tmp_path / "std.json", "standard", {"bf16": 0.8})
    with pytest.raises(SystemExit, match="no benchmark ratio for blockwise"):
        t2.report(res, [std])


def test_run_runs_both_invocations_into_the_folder(tmp_path, monkeypatch) -> None:
    calls = []

    def fake_run(args, cwd, stdout, check):
        calls.append(args)
        stdout.write("table\n")
        Path(args[-1]).write_text("{}")

    monkeypatch.setattr(t2.subprocess, "run", fake_run)
    files = t2.run_benchmarks("7dbb020", REPO / "results" / "table2", tmp_path / "out")
    assert files == [tmp_path / "out" / "table2_std.json", tmp_path / "out" / "table2_cc.json"]
    assert all(f.is_file() and f.with_suffix(".md").read_text() == "table\n" for f in files)
    assert [a[1] for a in calls] == ["benchmarks/bench_trainer.py"] * 2
    assert "clipping.mode=calibrated" in calls[1] and "clipping.mode=calibrated" not in calls[0]


def test_missing_inputs_are_refused_in_one_line_before_any_run(tmp_path) -> None:
    script = str(REPO / "benchmarks" / "table2_compute.py")
    for args, says in (
        (
            ["--results", str(tmp_path / "nowhere"), "--run", str(tmp_path / "out")],
            "no such folder",
        ),
        (["--bench", str(tmp_path / "absent.json")], "--bench: no such file"),
    ):
        out = subprocess.run(
            [sys.executable, script, *args], cwd=REPO, capture_output=True, text=True, timeout=120
        )
        assert out.returncode == 2 and says in out.stderr
    assert not (tmp_path / "out").exists()
