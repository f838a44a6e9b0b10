"""The token viewer in a real browser: headless Chromium for a closed network, and the
screenshot in the docs (docs/figures/token_viewer.png), made through the user's pipeline.

    python scripts/token_viewer_screenshot.py [--out docs/figures/token_viewer.png]
    python scripts/token_viewer_screenshot.py --source results --experiment table2 --run <id>

Without ``--source`` it runs the test preset (seconds, numbers mean nothing) into a
temporary folder with ``sweep.py``: blockwise FP8 with standard clipping and with
Calibrated Clipping (K = 1), seed 0, samples dumped every step (``TEST_RUNS``). Then it
writes the viewer pages with ``fp8rl.analysis.viewer.write_viewers``, opens the plain FP8
run's page (or ``--run``'s) filtered to negative advantages and garbled answers, sorted by
the tokens clipped at the lower bound (``DOC_VIEW``), hovers the first such token and saves
the window. Needs Debian's browser (``apt-get install chromium chromium-driver``) and
selenium (the dev extra); ``tests/analysis/test_viewer.py`` drives the browser through
``start_chromium`` and builds its runs with ``make_test_runs``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fp8rl.analysis.load import runs_frame  # noqa: E402
from fp8rl.analysis.viewer import write_viewers  # noqa: E402

#: Headless on a machine without network: no GPU, /tmp instead of a small /dev/shm, and
#: nothing that phones home (every host name resolves to nothing). As root also
#: ``--no-sandbox`` (:func:`chromium_flags`): Chromium refuses to start as root otherwise.
CHROMIUM_FLAGS = (
    "--headless=new",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--no-first-run",
    "--disable-extensions",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--metrics-recording-only",
    "--mute-audio",
    "--host-resolver-rules=MAP * ~NOTFOUND",
)
HOW_TO_INSTALL = "apt-get install -y chromium chromium-driver"

#: The two runs of the default screenshot: the test preset, plain FP8 and FP8 + CC.
TEST_RUNS = (
    "+experiment=test",
    "granularity=blockwise",
    "clipping=standard,calibrated",
    "clipping.period=1",
    "train.dump_samples_every=1",
    "train.dump_samples=8",
)
#: The docs' view: coloured by clip side, A < 0, garbled answers, most tokens clipped at the
#: lower bound first.
DOC_VIEW = "#colour=clip&adv=neg&answer=garbled&sort=clip_low&dir=desc"


def chromium_paths() -> tuple[str, str] | None:
    """``(browser, driver)`` executables of Debian's chromium, or None when missing."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    return (browser, driver) if browser and driver else None


def chromium_flags(root: bool | None = None) -> tuple[str, ...]:
    """:data:`CHROMIUM_FLAGS`, and ``--no-sandbox`` when running as root (``root``: None =
    this process's effective user id is 0); other users keep Chromium's sandbox."""
    if root is None:
        root = hasattr(os, "geteuid") and os.geteuid() == 0
    return (*CHROMIUM_FLAGS, "--no-sandbox") if root else CHROMIUM_FLAGS


def start_chromium(width: int = 1400, height: int = 1000) -> webdriver.Chrome:
    """Headless Chromium with :func:`chromium_flags`, recording the console (read it with
    ``driver.get_log("browser")``). Raises RuntimeError when the browser is missing."""
    paths = chromium_paths()
    if paths is None:
        raise RuntimeError(f"no chromium or chromedriver on PATH: {HOW_TO_INSTALL}")
    options = Options()
    options.binary_location = paths[0]
    for flag in (*chromium_flags(), f"--window-size={width},{height}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    os.environ.setdefault("SE_OFFLINE", "true")  # never let Selenium Manager download
    return webdriver.Chrome(options=options, service=Service(executable_path=paths[1]))


def make_test_runs(runs_dir: Path, cache_dir: Path | None = None, threads: int = 1) -> None:
    """The :data:`TEST_RUNS` grid with ``sweep.py``, as a user runs it (seconds)."""
    cmd = [sys.executable, str(REPO / "sweep.py"), "-m", *TEST_RUNS, f"runs_dir={runs_dir}"]
    cmd += [f"threads={threads}"] + ([f"cache_dir={cache_dir}"] if cache_dir else [])
    env = dict(os.environ, PYTHONPATH=str(REPO), FP8RL_PROGRESS="0")
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"sweep.py failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")


def photograph(driver: webdriver.Chrome, page: Path, png: Path, view: str = DOC_VIEW) -> None:
    """Open ``page`` with ``view`` (the viewer reads its settings from the URL), hover the
    first token clipped at the lower bound that is shown, and save the window as ``png``."""
    driver.get(page.resolve().as_uri() + view)
    clipped = [
        t for t in driver.find_elements(By.CSS_SELECTOR, ".response .tok.low") if t.is_displayed()
    ]
    if clipped:
        ActionChains(driver).move_to_element(clipped[0]).perform()
    png.parent.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(png))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "figures" / "token_viewer.png")
    ap.add_argument("--source", help="a run store or results/ folder (default: test runs)")
    ap.add_argument("--experiment", default="test")
    ap.add_argument("--run", help="the run to show (default: the plain FP8 run)")
    ap.add_argument("--cache-dir", help="base-model cache for the test runs")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(args.source) if args.source else Path(tmp) / "runs"
        if not args.source:
            make_test_runs(source, args.cache_dir)
        runs = runs_frame(source, args.experiment)
        pages = write_viewers(source, args.experiment, runs, Path(tmp) / "viewer")
        fp8 = [arm.role == "plain" and arm.granularity is not None for arm in runs["arm_spec"]]
        plain = runs.loc[fp8, "run_id"]
        run_id = args.run or (plain.iloc[0] if len(plain) else runs["run_id"].iloc[0])
        page = next(p.path for p in pages if p.path.stem == run_id)
        driver = start_chromium(width=1600, height=1000)
        try:
            photograph(driver, page, args.out)
        finally:
            driver.quit()
    print(f"{args.out}: {args.experiment}/{run_id}, view {DOC_VIEW}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
