"""The token viewer (fp8rl.analysis.viewer): what it computes from sample dumps, old and
new, and the pages in a real headless browser (Debian's chromium, driven by selenium).

The browser tests run the test preset with ``sweep.py`` (blockwise FP8, standard and
Calibrated Clipping, samples dumped every step: seconds) and open its pages from files.
Without the browser they skip and say how to install it; with ``CI=true`` they fail.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
from pathlib import Path

import pytest
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select
from synthetic_store import add_run

from fp8rl.analysis.load import runs_frame
from fp8rl.analysis.viewer import (
    SUMMARY_COLUMNS,
    compare_page,
    comparison_runs,
    read_dumps,
    run_page,
    run_view,
    write_viewers,
)
from fp8rl.runs import RunStore

from room_rules import REPO

_spec = importlib.util.spec_from_file_location(
    "token_viewer_screenshot", REPO / "scripts" / "token_viewer_screenshot.py"
)
shots = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(shots)

# --------------------------------------------------------------------------------------
# What the pages hold (no browser)


def _token(text, adv, ratio, rollout, old, **more):
    return {"token": text, "rollout_log_prob": rollout, "old_log_prob": old, "ratio": ratio,
            "entropy": 0.5, "advantage": adv, **more}  # fmt: skip


def _format1_dump(step: int) -> dict:
    """A dump as the trainer wrote it before format 2: one ``clipped`` flag, no bounds."""
    tokens = [
        _token("4", -1.0, 0.5, -1.0, -0.5, clipped=True),
        _token("=", -1.0, 1.0, -2.0, -2.0, clipped=False),
    ]
    sample = {"id": "p0", "question": "2+2?", "answer": "4", "response": "4=",
              "score": 0.0, "correct": False, "finished": True, "tokens": tokens}  # fmt: skip
    return {"step": step, "samples": [sample]}


def _add_dumped_run(store, arm, seed, dumps, **extra) -> str:
    curve = lambda step: {"fp8rl/clip_low": 0.9, "fp8rl/clip_high": 1.1}  # noqa: E731
    run_id = add_run(store, "t", arm, seed, scores={"a": 0.5}, curve=curve, **extra)
    for dump in dumps:
        path = store.run_dir("t", run_id) / "samples" / f"step_{dump['step']:08d}.json"
        path.write_text(json.dumps(dump, indent=2))
    return run_id


def test_a_format_1_dump_reads_with_what_can_be_recovered_and_the_rest_na(tmp_path):
    store = RunStore(tmp_path / "runs")
    run_id = _add_dumped_run(store, "Blockwise FP8", 0, [_format1_dump(2)])
    info = store.run_info("t", run_id)
    (dump,) = read_dumps(info.path)
    assert dump.format == 1 and dump.clip_low is None
    view = run_view(info.path, info.config, run_id, "t")
    assert view["steps"]["2"]["clip_low"] == 0.9  # from metrics.jsonl
    (resp,) = view["responses"]
    assert resp["clip"] == [1, 0]  # the flag and A < 0: the lower bound
    assert resp["lr"][0] == pytest.approx(math.log(0.5), rel=1e-3) and resp["lr"][1] == 0
    assert resp["tr"][0] == pytest.approx(0.5)  # old - rollout: pi_old was the trainer's
    assert resp["w"] == [None, None]  # no TIS threshold in a format-1 dump
    summary = resp["summary"]
    assert (summary["boxed"], summary["garbled"], summary["clip_low"]) == (False, True, 1)
    assert summary["clipped"] == 0.5 and summary["row"] is None  # not in format 1: n/a
    assert not _has_shadow(view)
    bypass = {**info.config, "train": {"old_logprob_source": "rollout"}}
    assert run_view(info.path, bypass, run_id, "t")["responses"][0]["tr"] == [None, None]


def test_a_format_2_dump_gives_the_raw_ratio_bounds_and_clip_side(tmp_path):
    store = RunStore(tmp_path / "runs")
    tokens = [
        _token("7", 1.0, 1.5, -1.0, -1.0, clipped=True, clipped_low=False, clipped_high=True,
               is_ratio=3.0),
        _token("\\boxed{7}", 1.0, 1.0, -1.0, -1.0, clipped=False, clipped_low=False,
               clipped_high=False, is_ratio=0.5),
    ]  # fmt: skip
    sample = {"id": "p", "question": "q", "answer": "7", "response": "7 \\boxed{7}",
              "score": 1.0, "correct": True, "finished": True, "row": 9, "group": "0",
              "minibatch": 1, "off_policy": True, "tokens": tokens}  # fmt: skip
    dump = {"step": 1, "format": 2, "clip_low": 0.8, "clip_high": 1.2, "loss": "vanilla",
            "tis_threshold": 2.0, "samples": [sample]}  # fmt: skip
    run_id = _add_dumped_run(store, "Blockwise FP8", 0, [dump])
    info = store.run_info("t", run_id)
    view = run_view(info.path, info.config, run_id, "t")
    step = {"format": 2, "clip_low": 0.8, "clip_high": 1.2, "loss": "vanilla"}
    no_shadow = {"shadow": False, "fp8_only": None, "bf16_only": None}
    assert view["steps"]["1"] == {**step, "tis_threshold": 2.0, "responses": 1, **no_shadow}
    (resp,) = view["responses"]
    assert resp["clip"] == [2, 0] and resp["is"] == [3.0, 0.5] and resp["w"] == [2.0, 0.5]
    assert resp["tr"] == [pytest.approx(math.log(r), rel=1e-3) for r in (3.0, 0.5)]
    summary = resp["summary"]
    assert summary["boxed"] and not summary["garbled"] and summary["row"] == 9
    assert {key for key, *_ in SUMMARY_COLUMNS} <= set(summary)
    assert not _has_shadow(view)  # a format-2 dump from before the shadow's fields


def _has_shadow(view: dict) -> bool:
    """Whether a run view holds shadow data anywhere; without it every shadow value is
    None (the page: "no shadow data"), never 0."""
    steps, responses = view["steps"].values(), view["responses"]
    nothing = (
        all(not s["shadow"] and s["fp8_only"] is s["bf16_only"] is None for s in steps)
        and all(r["summary"]["fp8_only"] is r["summary"]["bf16_only"] is None for r in responses)
        and all(v is None for r in responses for k in ("mech", "slr", "sr", "sclip") for v in r[k])
    )
    return not nothing


def _shadow_dump(step: int, prompt: str = "p", low: float = 0.8) -> dict:
    """A dump with the BF16 shadow's fields: tokens clipped under FP8 only, under BF16
    only, under both and under neither (A < 0, bounds [low, 1.2])."""

    def tok(text, ratio, shadow_ratio):
        flags = {"clipped": ratio < low, "clipped_low": ratio < low, "clipped_high": False}
        shadow = {"shadow_old_log_prob": -1.0, "shadow_log_prob": -1.0 + math.log(shadow_ratio),
                  "shadow_ratio": shadow_ratio, "shadow_clipped_low": shadow_ratio < low,
                  "shadow_clipped_high": False}  # fmt: skip
        return _token(text, -1.0, ratio, -1.0, -1.0, is_ratio=1.0, **flags, **shadow)

    tokens = [tok("a", 0.7, 0.9), tok("b", 0.9, 0.7), tok("c", 0.6, 0.5), tok("d", 1.0, 1.0)]
    sample = {"id": prompt, "question": "q", "answer": "7", "response": "abcd", "score": 0.0,
              "correct": False, "finished": True, "row": 4, "group": "1", "minibatch": 1,
              "off_policy": True, "tokens": tokens}  # fmt: skip
    return {"step": step, "format": 2, "clip_low": low, "clip_high": 1.2, "loss": "vanilla",
            "tis_threshold": 2.0, "samples": [sample]}  # fmt: skip


def test_a_dump_with_the_bf16_shadow_says_what_fp8_clipped_that_bf16_would_not(tmp_path):
    store = RunStore(tmp_path / "runs")
    run_id = _add_dumped_run(store, "Blockwise FP8", 0, [_shadow_dump(1), _format1_dump(2)])
    info = store.run_info("t", run_id)
    view = run_view(info.path, info.config, run_id, "t")
    first, old = view["responses"]
    assert first["mech"] == [1, 2, 3, 0]  # FP8 only, BF16 only, both, neither
    assert first["sclip"] == [0, 1, 1, 0] and first["sr"] == [0.9, 0.7, 0.5, 1.0]
    assert first["slr"][1] == pytest.approx(math.log(0.7), rel=1e-3)
    assert (first["summary"]["fp8_only"], first["summary"]["bf16_only"]) == (1, 1)
    step = view["steps"]["1"]
    assert (step["shadow"], step["fp8_only"], step["bf16_only"]) == (True, 1, 1)
    # the older dump of step 2 has no shadow data: None, not 0
    assert old["mech"] == [None, None] and old["summary"]["fp8_only"] is None
    assert view["steps"]["2"]["shadow"] is False and view["steps"]["2"]["fp8_only"] is None
    html = run_page(store, "t", run_id)
    data = json.loads(html.split('type="application/json">')[1].split("</script>")[0])
    assert data["colour"] == "mech" and data["mechanism"][1] == "FP8 only"


def test_pages_are_self_contained_and_no_text_can_end_their_script(tmp_path):
    store = RunStore(tmp_path / "runs")
    dump = _format1_dump(1)
    dump["samples"][0]["response"] = "</script><script>alert(1)</script>"
    run_id = _add_dumped_run(store, "Blockwise FP8", 0, [dump])
    html = run_page(store, "t", run_id)
    assert html.count("</script>") == 2  # the data's and the viewer's own
    assert "http://" not in html and "https://" not in html and " src=" not in html
    assert "@import" not in html and "url(" not in html


def test_comparisons_pair_plain_fp8_with_its_bf16_twin_and_with_cc_of_one_seed(tmp_path):
    store = RunStore(tmp_path / "runs")
    ids = {
        (arm, seed): _add_dumped_run(store, arm, seed, [_format1_dump(1)], **{"clipping.period": 5})
        for arm in ("Rowwise FP8", "Rowwise FP8 + CC", "Blockwise FP8", "BF16")
        for seed in (0, 1)
    }
    no_dumps = _add_dumped_run(store, "Blockwise FP8 + CC", 1, [], **{"clipping.period": 5})
    runs = runs_frame(store, "t")
    pairs = comparison_runs(runs)
    expected = [("rowwise", s, a) for s in (0, 1) for a in ("bf16", "cc")]
    expected += [("blockwise", 0, "bf16"), ("blockwise", 1, "bf16"), ("blockwise", 1, "cc")]
    assert [(p.granularity, p.seed, p.against) for p in pairs] == expected
    assert pairs[-1].right == no_dumps
    assert (pairs[0].left, pairs[0].right) == (ids["Rowwise FP8", 0], ids["BF16", 0])
    assert (pairs[1].left, pairs[1].right) == (ids["Rowwise FP8", 0], ids["Rowwise FP8 + CC", 0])
    assert [p.label for p in pairs[:2]] == [
        "Rowwise FP8 vs BF16, seed 0", "Rowwise FP8 vs Rowwise FP8 + CC, seed 0"]  # fmt: skip
    pages = write_viewers(store, "t", runs, tmp_path / "viewer")
    names = sorted(p.path.name for p in pages)
    compared = [
        f"compare_{g}{v}_seed{s}.html"
        for g, s, v in [
            ("rowwise", 0, ""),
            ("rowwise", 1, ""),
            ("rowwise", 0, "_vs_bf16"),
            ("rowwise", 1, "_vs_bf16"),
            ("blockwise", 0, "_vs_bf16"),
            ("blockwise", 1, "_vs_bf16"),
        ]
    ]
    assert names == sorted([f"{i}.html" for i in ids.values()] + compared)  # fmt: skip
    (tmp_path / "viewer" / "old.html").write_text("from an earlier build")
    write_viewers(store, "t", runs, tmp_path / "viewer")
    assert not (tmp_path / "viewer" / "old.html").exists()
    html = compare_page(store, "t", pairs[0].left, pairs[0].right)
    data = json.loads(html.split('type="application/json">')[1].split("</script>")[0])
    assert data["pairs"][0]["left"] == [0] and data["pairs"][0]["right"] == [0]
    assert data["pairs"][0]["summary"]["left_fp8_only"] is None  # format 1: no shadow data
    assert data["colour"] == "clip"  # nothing on the page to colour by the mechanism


def test_show_run_writes_one_runs_page_and_its_comparisons_without_the_report(tmp_path, capsys):
    store = RunStore(tmp_path / "runs")
    fp8 = _add_dumped_run(store, "Blockwise FP8", 0, [_shadow_dump(1)])
    twin = _add_dumped_run(store, "BF16", 0, [_shadow_dump(1)])
    _add_dumped_run(store, "Blockwise FP8 + CC", 0, [])  # no dumps: no page with it
    _add_dumped_run(store, "Rowwise FP8", 0, [_shadow_dump(1)])  # another run: not written
    spec = importlib.util.spec_from_file_location("show_run", REPO / "scripts" / "show_run.py")
    show_run = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(show_run)
    out = tmp_path / "pages"
    assert show_run.main([str(store.run_dir("t", fp8)), "--viewer", "--out", str(out)]) == 0
    names = {p.name for p in out.iterdir()}
    assert names == {f"{fp8}.html", "compare_blockwise_vs_bf16_seed0.html"}
    printed = capsys.readouterr().out
    assert f"Run t/{fp8}" in printed and (out / f"{fp8}.html").resolve().as_uri() in printed
    assert f'"run_id":"{twin}"' in (out / "compare_blockwise_vs_bf16_seed0.html").read_text()
    bare = _add_dumped_run(store, "Tensorwise FP8", 0, [])
    assert show_run.main([str(store.run_dir("t", bare)), "--viewer", "--out", str(out)]) == 2
    assert "no sample dumps" in capsys.readouterr().err


# --------------------------------------------------------------------------------------
# The pages in a real browser


@pytest.fixture(scope="module")
def driver():
    if shots.chromium_paths() is None:
        message = (
            "the token viewer's browser tests need Debian's chromium and chromium-driver: "
            f"{shots.HOW_TO_INSTALL} (.ci/run installs them)"
        )
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true and {message}")
        pytest.skip(message)
    browser = shots.start_chromium()
    yield browser
    browser.quit()


@pytest.fixture(scope="module")
def pages(tmp_path_factory, cache, driver):
    """The test preset's two runs (sweep.py, as a user runs it) and their viewer pages."""
    root = tmp_path_factory.mktemp("viewer")
    shots.make_test_runs(root / "runs", cache)
    runs = runs_frame(root / "runs", "test")
    links = write_viewers(root / "runs", "test", runs, root / "viewer")
    dumps = {r: read_dumps(root / "runs" / "test" / r) for r in runs["run_id"]}
    plain = runs.loc[runs["arm"] == "Blockwise FP8", "run_id"].item()
    return {"links": links, "dumps": dumps, "plain": plain, "root": root}


def _open(driver, path: Path, view: str = "") -> None:
    driver.get(path.resolve().as_uri() + view)
    driver.find_element(By.ID, "summary")  # the script ran


def _shown(driver, css: str) -> list:
    return [e for e in driver.find_elements(By.CSS_SELECTOR, css) if e.is_displayed()]


def _page(pages, stem: str) -> Path:
    return next(link.path for link in pages["links"] if link.path.stem == stem)


def test_a_run_page_loads_cleanly_with_every_response_and_token(driver, pages):
    for run_id, dumps in pages["dumps"].items():
        _open(driver, _page(pages, run_id))
        assert driver.get_log("browser") == []  # no console error, warning or message
        samples = [s for d in dumps for s in d.samples]
        assert len(driver.find_elements(By.CSS_SELECTOR, ".response")) == len(samples) == 16
        tokens = sum(len(s["tokens"]) for s in samples)
        assert len(driver.find_elements(By.CSS_SELECTOR, ".response .tok")) == tokens
        assert len(_shown(driver, "#summary tbody tr")) == len(samples)
        assert driver.find_elements(By.CSS_SELECTOR, ".tok.low")  # clipping is visible
        # the trainer dumped the BF16 shadow: the page opens on FP8 vs BF16 clipping
        assert driver.find_element(By.ID, "colour").get_attribute("value") == "mech"
        head = driver.find_element(By.ID, "head").text
        assert "clipped FP8 only" in head and "no shadow data" not in head
        first = driver.find_element(By.CSS_SELECTOR, ".response .tok")  # no filter: shown
        ActionChains(driver).move_to_element(first).perform()
        assert "BF16 shadow r_bf16" in driver.find_element(By.ID, "inspect").text


def _fits(driver) -> bool:
    """No horizontal scrollbar: neither the summary table's box nor the page's."""
    widths = driver.execute_script(
        "const box = document.getElementById('summary-box'), doc = document.documentElement;"
        "return [box.scrollWidth, box.clientWidth, doc.scrollWidth, doc.clientWidth];"
    )
    return widths[0] <= widths[1] and widths[2] <= widths[3]


def test_every_page_fits_a_1400_px_window(driver, pages):
    assert driver.execute_script("return window.innerWidth") == 1400
    for link in pages["links"]:
        _open(driver, link.path)
        assert _fits(driver), link.path.name


def test_chromium_keeps_its_sandbox_unless_run_as_root():
    assert "--no-sandbox" in shots.chromium_flags(root=True)
    assert "--no-sandbox" not in shots.chromium_flags(root=False)
    assert ("--no-sandbox" in shots.chromium_flags()) == (os.geteuid() == 0)


def test_fp8_against_its_bf16_twin_and_an_old_dump_without_shadow_data(driver, tmp_path):
    """Synthetic dumps: FP8 and its BF16 twin with the shadow's fields at step 1, the FP8
    run's step 2 from before them, on the run page and the FP8-vs-BF16 comparison."""
    store = RunStore(tmp_path / "runs")
    fp8 = _add_dumped_run(store, "Blockwise FP8", 0, [_shadow_dump(1), _format1_dump(2)])
    twin = _add_dumped_run(store, "BF16", 0, [_shadow_dump(1)])
    links = write_viewers(store, "t", runs_frame(store, "t"), tmp_path / "viewer")
    _open(driver, next(link.path for link in links if link.path.stem == fp8))
    assert driver.get_log("browser") == [] and _fits(driver)
    head = driver.find_element(By.ID, "head").text
    assert "Steps 2: no shadow data" in head and "clipped FP8 only 1, BF16 only 1" in head
    keys = [
        h.get_attribute("data-key") for h in driver.find_elements(By.CSS_SELECTOR, "#summary th")
    ]
    rows = [r.find_elements(By.TAG_NAME, "td") for r in _shown(driver, "#summary tbody tr")]
    cells = [(r[keys.index("fp8_only")].text, r[keys.index("bf16_only")].text) for r in rows]
    assert cells == [("1", "1"), ("n/a", "n/a")]  # the old dump: n/a, not 0
    assert rows[1][keys.index("fp8_only")].get_attribute("title") == "no shadow data"
    first = driver.find_elements(By.CSS_SELECTOR, "#resp-0-0 .tok")
    colours = [t.value_of_css_property("background-color") for t in first]
    assert len(set(colours)) == 4  # FP8 only, BF16 only, both, neither
    ActionChains(driver).move_to_element(first[0]).perform()
    assert "FP8 vs BF16 shadow FP8 only" in driver.find_element(By.ID, "inspect").text
    old = driver.find_elements(By.CSS_SELECTOR, "#resp-0-1 .tok")[0]
    ActionChains(driver).move_to_element(old).perform()
    assert "no shadow data" in driver.find_element(By.ID, "inspect").text
    assert "no shadow data" in driver.find_element(By.ID, "resp-0-1").text  # its badge
    _open(driver, tmp_path / "viewer" / "compare_blockwise_vs_bf16_seed0.html")
    assert driver.get_log("browser") == [] and _fits(driver)
    assert twin in driver.find_element(By.ID, "head").text
    (pair,) = driver.find_elements(By.CSS_SELECTOR, ".pair")
    assert [h.text for h in pair.find_elements(By.TAG_NAME, "h4")] == [
        "Blockwise FP8, seed 0", "BF16, seed 0"]  # fmt: skip


def test_filters_sort_and_hover_change_what_is_shown(driver, pages):
    _open(driver, _page(pages, pages["plain"]))
    samples = [s for d in pages["dumps"][pages["plain"]] for s in d.samples]
    negative = sum(s["tokens"][0]["advantage"] < 0 for s in samples)
    Select(driver.find_element(By.ID, "adv")).select_by_value("neg")
    assert 0 < len(_shown(driver, ".response")) == negative < len(samples)
    assert driver.find_element(By.ID, "count").text == f"{negative} of 16 responses shown"
    Select(driver.find_element(By.ID, "step")).select_by_value("2")
    step_2 = pages["dumps"][pages["plain"]][1].samples
    assert len(_shown(driver, ".response")) == sum(s["tokens"][0]["advantage"] < 0 for s in step_2)
    Select(driver.find_element(By.ID, "step")).select_by_value("all")
    driver.find_element(By.CSS_SELECTOR, 'th[data-key="clip_low"]').click()
    keys = [
        h.get_attribute("data-key") for h in driver.find_elements(By.CSS_SELECTOR, "#summary th")
    ]
    rows = _shown(driver, "#summary tbody tr")
    cells = [int(r.find_elements(By.TAG_NAME, "td")[keys.index("clip_low")].text) for r in rows]
    assert cells == sorted(cells, reverse=True)
    Select(driver.find_element(By.ID, "colour")).select_by_value("ent")
    token = _shown(driver, ".response .tok")[0]
    ActionChains(driver).move_to_element(token).perform()
    inspector = driver.find_element(By.ID, "inspect").text
    assert "entropy" in inspector and "raw IS ratio" in inspector and "bounds [L, H]" in inspector
    assert driver.get_log("browser") == []


def test_the_comparison_pairs_the_same_prompt_at_the_same_step(driver, pages):
    _open(driver, _page(pages, "compare_blockwise_seed0"))
    assert driver.get_log("browser") == []
    pairs = driver.find_elements(By.CSS_SELECTOR, ".pair")
    assert pairs and len(_shown(driver, "#summary tbody tr")) == len(pairs)
    for pair in pairs:
        key = (pair.get_attribute("data-step"), pair.get_attribute("data-prompt"))
        for side in ("left", "right"):
            cards = pair.find_elements(By.CSS_SELECTOR, f".side.{side} .response")
            keys = {(c.get_attribute("data-step"), c.get_attribute("data-prompt")) for c in cards}
            assert keys == {key}
    Select(driver.find_element(By.ID, "step")).select_by_value("1")
    assert all(p.get_attribute("data-step") == "1" for p in _shown(driver, ".pair"))


def test_a_screenshot_is_written(driver, pages, tmp_path):
    png = tmp_path / "viewer.png"
    shots.photograph(driver, _page(pages, pages["plain"]), png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000
    assert driver.find_element(By.ID, "adv").get_attribute("value") == "neg"  # the docs' view
    assert "lower bound" in driver.find_element(By.ID, "inspect").text  # a clipped token
