"""A tiny model's verl run prepared from the tiny world (fp8rl.verl_ext.tiny_world): the
base model is the tiny backend's (the same cache entry), each step's training rows are the
problems the tiny trainer draws at that step, and the held-out rows carry their caps."""

from __future__ import annotations

import pandas as pd
from transformers import AutoTokenizer

from fp8rl.config import override
from fp8rl.verl_ext.presets import TINY_CAP_KEY
from fp8rl.verl_ext.tiny_world import CHAT_TEMPLATE, prepare
from fp8rl.world.eval_config import eval_config
from fp8rl.world.evaluate import select_items
from fp8rl.world.sft import base_model_key, sft_config
from fp8rl.world.tasks import derived_seed, load_eval_set, training_mix

from quick_runs import QUICK


def test_prepare_writes_the_tiny_base_and_each_steps_draw(tmp_path, cache) -> None:
    cfg = override(QUICK, {"eval.every": 1})
    summary = prepare(cfg, tmp_path, cache)
    assert summary["base"] == str(cache / base_model_key(sft_config(cfg)))  # no rebuild
    model = tmp_path / "model"
    assert (model / "config.json").is_file()
    assert AutoTokenizer.from_pretrained(model).chat_template == CHAT_TEMPLATE
    train = pd.read_parquet(tmp_path / "data" / "train.parquet")
    r = cfg.rollout
    drawn = [
        p.id
        for step in range(1, cfg.steps + 1)
        for p in training_mix(r.prompts_per_step, derived_seed(cfg.seed, step, 0),
                              difficulties=r.difficulties)
    ]  # fmt: skip
    assert [row["id"] for row in train["extra_info"]] == drawn
    assert {row[TINY_CAP_KEY] for row in train["extra_info"]} == {r.max_new_tokens}
    assert summary["rows"] == {"train": len(drawn), **dict.fromkeys(cfg.eval.families, 1)}
    for family in cfg.eval.families:
        val = pd.read_parquet(tmp_path / "data" / f"val_{family}.parquet")
        assert list(val["data_source"]) == [family]
        assert val["extra_info"][0][TINY_CAP_KEY] == cfg.eval.max_new_tokens


def test_the_held_out_rows_are_the_items_the_tiny_backend_evaluates(tmp_path, cache) -> None:
    """The stratified sample over the evaluated difficulties (fp8rl.world.evaluate), not
    the first ``eval.limit`` items of a set stored in difficulty order (all difficulty 1)."""
    cfg = override(QUICK, {"eval.every": 1, "eval.limit": 6, "eval.families": ["add_sub"]})
    prepare(cfg, tmp_path, cache)
    ec = eval_config(cfg)
    expected = select_items(load_eval_set("add_sub"), ec.limit, ec.difficulties)
    val = pd.read_parquet(tmp_path / "data" / "val_add_sub.parquet")
    assert [row["id"] for row in val["extra_info"]] == [p.id for p in expected]
    assert len({p.difficulty for p in expected}) == len(ec.difficulties) > 1
