"""Show it (issue 48, part 4): a study declared in a folder of its own — two arms, one claim —
gets its plan, its report and its verdict from ``python -m fp8rl.study``, with no library
file touched. The fast tests report from a synthetic run store; the slow one runs the real
study (the test preset) through ``sweep.py`` and reports what it ran."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from synthetic_store import add_run

from fp8rl.runs import RunStore
from fp8rl.study.cli import main

REPO = Path(__file__).resolve().parents[2]

DECLARATION = """
from fp8rl.study import Claim, Study

STUDY = Study(
    name="throwaway",
    title="A throw-away study",
    experiment="throwaway",
    grids=(
        ("+experiment=test", "experiment_name=throwaway", "granularity=bf16,tensorwise",
         "seed={seeds}"{extra}),
    ),
    endpoints=("final", "gain"),
    claims=(Claim("FP8 loses accuracy", "final", "{arm}", "BF16", sign=-1),),
)
"""


def declare(
    root: Path, *, arm: str = "Tensorwise FP8", seeds: str = "0,1,2", extra: str = ""
) -> Path:
    folder = root / "studies" / "throwaway"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "study.py").write_text(DECLARATION.format(arm=arm, seeds=seeds, extra=extra))
    (folder / "report.md").write_text("Two arms, one claim; nothing here is a result.\n")
    return root / "studies"


def cli(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(args), out, err)
    return code, out.getvalue(), err.getvalue()


def test_its_plan_is_read_from_the_presets(tmp_path: Path) -> None:
    studies = declare(tmp_path)
    code, out, err = cli("--studies-dir", str(studies), "plan", "throwaway",
                         "--runs-dir", str(tmp_path / "runs"))  # fmt: skip
    assert code == 0, err
    rows = [line for line in out.splitlines() if line.startswith("| 1 |")]
    assert len(rows) == 6
    assert (
        sum("| BF16 |" in r for r in rows) == 3
        and sum("| Tensorwise FP8 |" in r for r in rows) == 3
    )
    assert all("| start |" in r for r in rows)
    assert "study throwaway: 6 runs (6 start)" in out
    code, out, _ = cli("--studies-dir", str(studies), "list")
    assert out == "throwaway: A throw-away study\n"


def test_a_claim_on_an_arm_it_does_not_run_is_refused_in_one_line(tmp_path: Path) -> None:
    studies = declare(tmp_path, arm="Rowwise FP8", seeds="0")
    code, out, err = cli("--studies-dir", str(studies), "plan", "throwaway",
                         "--runs-dir", str(tmp_path / "runs"))  # fmt: skip
    assert code == 2 and out == ""
    assert err.count("\n") == 1
    assert "claim 'FP8 loses accuracy' names arm(s) no grid runs: 'Rowwise FP8'" in err


def test_a_grid_that_does_not_compose_is_refused_in_one_line(tmp_path: Path) -> None:
    studies = declare(tmp_path, extra=', "train.lrr=1"')
    code, _, err = cli("--studies-dir", str(studies), "status", "throwaway")
    assert code == 2 and err.count("\n") == 1 and "a grid does not compose" in err


def test_an_unknown_study_names_the_known_ones(tmp_path: Path) -> None:
    code, _, err = cli("--studies-dir", str(declare(tmp_path)), "plan", "nope")
    assert code == 2 and "no study 'nope'" in err and "known: throwaway" in err


def test_its_report_and_verdict(tmp_path: Path) -> None:
    fp8, verdict = 0.30, "shown"  # every seed: FP8 20 points below BF16
    studies = declare(tmp_path)
    store = RunStore(tmp_path / "results")
    for seed, jitter in enumerate((0.0, 0.02, -0.01)):
        add_run(store, "throwaway", "BF16", seed, scores={"add_sub": 0.5 + jitter})
        add_run(store, "throwaway", "Tensorwise FP8", seed, scores={"add_sub": fp8 - jitter / 2})
    out_dir = tmp_path / "report"
    code, out, err = cli("--studies-dir", str(studies), "report", "throwaway",
                         "--source", str(tmp_path / "results"), "--out", str(out_dir))  # fmt: skip
    assert code == 0, err
    claims = pd.read_csv(out_dir / "claims.csv")
    assert claims["verdict"].iloc[0].split(":")[0] == verdict
    readme = (out_dir / "README.md").read_text()
    assert "Two arms, one claim" in readme and "## Claims" in readme
    assert (out_dir / "figures" / "accuracy.png").is_file()
    per_run = pd.read_csv(out_dir / "endpoints.csv")
    assert len(per_run) == 6 and set(per_run["arm"]) == {"BF16", "Tensorwise FP8"}
    assert f"throwaway: 1 {verdict}" in out


def test_a_claim_without_values_says_why_it_is_undecided(tmp_path: Path) -> None:
    studies = declare(tmp_path)
    store = RunStore(tmp_path / "results")
    for seed in range(2):
        add_run(store, "throwaway", "BF16", seed, scores={"add_sub": 0.5})
        add_run(store, "throwaway", "Tensorwise FP8", seed)  # never evaluated
    out_dir = tmp_path / "report"
    code, _, err = cli("--studies-dir", str(studies), "report", "throwaway",
                       "--source", str(tmp_path / "results"), "--out", str(out_dir))  # fmt: skip
    assert code == 0, err
    verdict = pd.read_csv(out_dir / "claims.csv")["verdict"].iloc[0]
    assert verdict == "undecided (no final value in the runs of Tensorwise FP8)"


@pytest.mark.slow
def test_the_real_study_runs_and_reports(tmp_path: Path, cache: Path) -> None:
    # the test preset evaluates nothing by default: step 0 and its last step (2) here
    extra = f', "cache_dir={cache}", "threads=1", "eval.every=2"'
    studies = declare(tmp_path, seeds="0,1", extra=extra)
    runs = tmp_path / "runs"
    base = [sys.executable, "-m", "fp8rl.study", "--studies-dir", str(studies)]
    done = subprocess.run([*base, "run", "throwaway", "--runs-dir", str(runs)], cwd=REPO,
                          capture_output=True, text=True, timeout=900)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "| BF16 |" in done.stdout and "study throwaway: 4 runs (4 done)" in done.stdout
    results = tmp_path / "results"
    done = subprocess.run([*base, "report", "throwaway", "--export-from", str(runs),
                           "--source", str(results), "--out", str(tmp_path / "report")],
                          cwd=REPO, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    claims = pd.read_csv(tmp_path / "report" / "claims.csv")
    assert claims["verdict"].iloc[0].split(":")[0] in ("shown", "opposite shown", "not shown")


def test_the_generic_writer_takes_the_thresholds_a_live_run_took() -> None:
    """time_to_failure reads a run with the thresholds its live monitor had
    (fp8rl.config.run.evaluation_size: planned evaluations, items x eval.k)."""
    import yaml

    from fp8rl.analysis.load import runs_frame
    from fp8rl.config import RunConfig
    from fp8rl.config.run import evaluation_size
    from fp8rl.rl.health import default_thresholds
    from fp8rl.study.writers import _thresholds

    runs = runs_frame(RunStore(REPO / "results"), "table2_world")
    for _, run in runs.iterrows():
        path = REPO / "results" / "table2_world" / run["run_id"] / "config.yaml"
        cfg = RunConfig.from_dict(yaml.safe_load(path.read_text()))
        assert _thresholds(run) == default_thresholds(**evaluation_size(cfg))


def test_a_missing_reference_run_is_one_line_and_exit_1(tmp_path: Path) -> None:
    """The frontier pilot's report through the room stops, in one line naming the run, when
    one of its BF16 reference runs is gone (as its own script does), and writes nothing."""
    import shutil

    root = tmp_path / "results"
    for experiment in ("table2", "bf16_search", "frontier_pilot"):
        shutil.copytree(REPO / "results" / experiment, root / experiment)
    shutil.rmtree(root / "bf16_search" / "0be94586780039af")
    code, out, err = cli("report", "frontier_pilot", "--source", str(root),
                         "--out", str(tmp_path / "report"))  # fmt: skip
    assert code == 1 and out == "" and err.count("\n") == 1
    assert "bf16_search/0be94586780039af" in err and "missing" in err
    assert not (tmp_path / "report").exists()


def test_a_study_with_a_runner_runs_it_with_the_run_store(tmp_path: Path) -> None:
    """``Study.options["runner"]``: ``run`` hands the script ``--runs-dir`` instead of
    running the grids through sweep.py (the tiny/verl agreement's way), then the status."""
    script = tmp_path / "runner.py"
    script.write_text(
        "import sys, pathlib\n"
        "pathlib.Path(sys.argv[sys.argv.index('--runs-dir') + 1], 'ran').write_text("
        "' '.join(sys.argv[1:]))\n"
    )
    studies = declare(tmp_path)
    declaration = studies / "throwaway" / "study.py"
    runner = f"    options={{'runner': ({str(script)!r}, '--x')}},\n    claims="
    declaration.write_text(declaration.read_text().replace("    claims=", runner))
    runs = tmp_path / "runs"
    runs.mkdir()
    code, out, err = cli("--studies-dir", str(studies), "run", "throwaway", "--runs-dir", str(runs))
    assert code == 0, err
    assert (runs / "ran").read_text() == f"--x --runs-dir {runs}"
    assert "study throwaway: 6 runs (6 start)" in out  # the runner ran none of the grids
