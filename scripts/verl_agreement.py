"""The tiny and the verl backend on one config, step 1 compared (issue 31 part 1): runs each
arm on both backends (and the negative control, ``algorithm.eps_low`` 0.01 wider on the tiny
side), compares them with ``fp8rl.verl_ext.agreement.compare_runs``, measures the layout
noise floor of each recipe and writes the report (markdown).

    python scripts/verl_agreement.py                       # every arm -> docs/verl_agreement.md
    python scripts/verl_agreement.py --arms bf16 --out -   # one arm, to stdout

A finished run is not run again (the run store skips it): delete ``--runs-dir`` to redo.
Each run's compact results (config, status, metrics, the step-1 token dump; no checkpoints)
go to ``--results`` (``results/verl_agreement/<arm>/<side>/test/<run id>``).
About 3-4 minutes per arm on 2 cores (the verl run).
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fp8rl.runs.store import CONFIG_FILE, STATUS_FILE  # noqa: E402
from fp8rl.verl_ext.agreement import ARMS, COMMON, CONTROL, VERL  # noqa: E402


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def wall_s(run_dir: Path) -> float:
    """The run's own wall time (its status: started to finished), whenever it ran."""
    from datetime import datetime

    status = json.loads((run_dir / STATUS_FILE).read_text())
    start, end = (datetime.fromisoformat(status[k]) for k in ("started_at", "finished_at"))
    return (end - start).total_seconds()


def run(runs: Path, *overrides: str) -> tuple[Path, float]:
    cmd = [sys.executable, str(ROOT / "sweep.py"), *overrides, f"runs_dir={runs}"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{out.stderr[-3000:]}")
    (found,) = (runs / "test").glob("[0-9a-f]" * 16)
    return found, wall_s(found)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arms", nargs="+", choices=sorted(ARMS), default=list(ARMS))
    ap.add_argument("--runs-dir", type=Path, default=ROOT / "runs" / "agreement")
    ap.add_argument("--out", default=str(ROOT / "docs" / "verl_agreement.md"))
    ap.add_argument(
        "--results",
        type=Path,
        default=ROOT / "results" / "verl_agreement",
        help="where each run's compact results go (fp8rl.analysis.export; in git)",
    )
    args = ap.parse_args()

    import yaml

    from fp8rl.analysis.export import export_experiment
    from fp8rl.verl_ext.agreement import compare_runs, failures, layout_noise_floor

    lines = [
        "# One method at two scales: the tiny and the verl backend, step 1",
        "",
        "Written by `python scripts/verl_agreement.py` (do not edit by hand) on "
        f"{time.strftime('%Y-%m-%d')}, {cpu_name()}, 2 threads. Each arm: "
        f"`python sweep.py {' '.join(COMMON)} <arm>` with `backend=tiny` and with "
        f"`{' '.join(VERL)}`; the control adds `{' '.join(CONTROL)}` on the tiny side. "
        "Checks and tolerances: `fp8rl.verl_ext.agreement` (docs/verl_backend.md, "
        "*One method at two scales*).",
        "",
    ]
    for arm in args.arms:
        overrides = (*COMMON, *ARMS[arm])
        base = args.runs_dir / arm
        tiny, t_tiny = run(base / "tiny", *overrides)
        control, _ = run(base / "control", *overrides, *CONTROL)
        verl, t_verl = run(base / "verl", *overrides, *VERL)
        for side in ("tiny", "control", "verl"):  # the record of what the report read
            export_experiment(base / side, "test", args.results / arm / side)
        checks = compare_runs(tiny, verl)
        control_failed = [c.name for c in failures(compare_runs(control, verl))]
        config = yaml.safe_load((tiny / CONFIG_FILE).read_text())
        g = config["granularity"]
        kwargs = {"block_size": g["block_size"]} if g.get("block_size") else {}
        dump = json.loads((verl / "samples" / "step_00000001.json").read_text())
        floor = layout_noise_floor(verl / "verl" / "model", dump, g["training"],
                                   config["train"]["lr"], **kwargs)  # fmt: skip
        verdict = "agree" if not failures(checks) else "DISAGREE"
        lines += [
            f"## `{' '.join(ARMS[arm])}`: {verdict}",
            "",
            f"tiny run {t_tiny:.0f} s, verl run {t_verl:.0f} s (wall, as the runs record it).",
            "",
            "| check | kind | ok | seen |",
            "|---|---|---|---|",
            *(
                f"| {c.name} | {c.kind} | {'yes' if c.ok else '**no**'} | "
                f"{c.detail.replace('|', chr(92) + '|')} |"
                for c in checks
            ),
            "",
            f"Negative control (`{' '.join(CONTROL)}` on the tiny side) fails: "
            + (", ".join(f"`{n}`" for n in control_failed) or "**nothing (the test fails)**"),
            "",
            f"Layout noise floor of `{g['training']}` (`layout_noise_floor`: the dumped rows "
            "through one trainer row by row and as one padded batch, one AdamW step): "
            f"gradients {floor['grad_rel']:.3g} apart (relative L2), updates "
            f"{floor['update_rel']:.3g}, log-probs before the update "
            f"{floor['log_prob_max']:.2g} (max abs).",
            "",
        ]
    text = "\n".join(lines)
    if args.out == "-":
        sys.stdout.write(text)
    else:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
