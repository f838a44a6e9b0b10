"""One method at two scales (issue 31 part 1): ``python sweep.py +experiment=test
model=tiny-test`` with ``backend=tiny`` and with ``backend=verl cluster=local_cpu``, step 1
compared by :func:`fp8rl.verl_ext.agreement.compare_runs`: the prompts, sampled token ids,
rewards and rollout log-probs exactly; the trainer's forward to FP32 reassociation; the
update's loss, gradient norm, KL, clip shares by side and sign, per-token ratios, calibrated
bounds and weights within the recipe's tolerance (``TOLERANCES``, docs/verl_backend.md). The
negative control in the same test: a tiny run whose ``algorithm.eps_low`` is 0.01 wider
must fail the comparison (its bounds and clip shares).

Every arm is in ``make test-all`` (a verl run each, about 3 minutes on 2 cores); ``make test``
compares the blockwise + CC arm of tests/verl_ext/test_cpu_e2e.py, reusing its verl run.
Runs: ``ppo_epochs=2`` so every row's last visit follows an update (the dump holds the whole
batch), a checkpoint and a token dump at every step, no evaluation.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from verl_agreement import assert_agree, assert_control_fails, run_dir

from fp8rl.verl_ext.agreement import ARMS, COMMON, CONTROL, VERL


@pytest.mark.slow
@pytest.mark.parametrize("arm", sorted(ARMS))
def test_the_tiny_and_the_verl_backend_run_one_method(tmp_path: Path, arm: str) -> None:
    overrides = (*COMMON, *ARMS[arm])
    tiny = run_dir(tmp_path, "tiny", *overrides)
    control = run_dir(tmp_path, "control", *overrides, *CONTROL)
    verl = run_dir(tmp_path, "verl", *overrides, *VERL)
    assert_agree(tiny, verl)
    assert_control_fails(control, verl, blockwise=arm.startswith("blockwise"))


@pytest.mark.slow
def test_the_token_viewer_shows_a_verl_run_token_by_token(tmp_path: Path) -> None:
    """A verl run's token dumps (fp8rl's actor) on the token viewer's page, in headless
    Chromium as the viewer's own tests open it: every dumped response and token, clipping
    visible, no console message; the same token count as the tiny twin's page."""
    import importlib.util
    import os

    from selenium.webdriver.common.by import By

    from fp8rl.analysis.load import runs_frame
    from fp8rl.analysis.viewer import read_dumps, write_viewers

    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location(
        "token_viewer_screenshot", root / "scripts" / "token_viewer_screenshot.py"
    )
    shots = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(shots)
    if shots.chromium_paths() is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true and no chromium: {shots.HOW_TO_INSTALL}")
        pytest.skip(f"no chromium: {shots.HOW_TO_INSTALL}")
    overrides = (*COMMON, *ARMS["bf16"])
    pages = {}
    for name, extra in (("tiny", ()), ("verl", VERL)):
        run = run_dir(tmp_path, name, *overrides, *extra)
        runs = runs_frame(tmp_path / name, "test")
        (link,) = [k for k in write_viewers(tmp_path / name, "test", runs, tmp_path / f"{name}_v")
                   if k.path.stem == run.name]  # fmt: skip
        pages[name] = (link.path, read_dumps(run))
    browser = shots.start_chromium()
    try:
        counts = {}
        for name, (page, dumps) in pages.items():
            browser.get(page.resolve().as_uri())
            browser.find_element(By.ID, "summary")
            assert browser.get_log("browser") == []
            samples = [s for d in dumps for s in d.samples]
            assert len(browser.find_elements(By.CSS_SELECTOR, ".response")) == len(samples)
            tokens = len(browser.find_elements(By.CSS_SELECTOR, ".response .tok"))
            assert tokens == sum(len(s["tokens"]) for s in samples) > 0
            assert browser.find_elements(By.CSS_SELECTOR, ".tok.low, .tok.high")
            counts[name] = tokens
        assert counts["verl"] == counts["tiny"]  # the same samples, token by token
    finally:
        browser.quit()
