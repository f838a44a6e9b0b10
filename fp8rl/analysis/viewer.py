"""The token viewer: static HTML pages of the responses a run dumped token by token.

A run with ``train.dump_samples_every > 0`` writes ``samples/step_<8 digits>.json``
(:func:`fp8rl.tiny.train.dump_samples`; the format's fields: ``docs/analysis.md``, "Token
viewer"). This module turns those dumps into one self-contained HTML file per run
(:func:`run_page`) and one per pair of runs (:func:`compare_page`: two runs side by side
at the same step and prompt; the report pairs plain FP8 with its BF16 twin and with FP8 +
CC, :func:`comparison_runs`). Everything a page shows is computed here, in Python; the
page's inline script (``viewer.js``) only displays: it colours tokens by a chosen
quantity, shows a token's numbers on hover, filters, sorts and pairs.

Per response, the **summary strip**: length, reward, boxed answer present, well formed,
garbled (:func:`fp8rl.rewards.is_garbled`), character 4-gram repetition, advantage, tokens
clipped at the lower / upper bound and their share, tokens clipped under FP8 but not under
the BF16 shadow and the reverse, mean entropy, largest ``|log r|``.

Per token, the **quantities** (:data:`QUANTITIES`): ``clip`` (0 none, 1 lower bound:
``A < 0`` and ``r < L``, 2 upper bound: ``A > 0`` and ``r > H``; the gradient is zeroed),
``lr`` = ``log r`` (new vs old at the row's last PPO visit), ``tr`` = trainer minus
rollout log-prob (the log of the raw importance ratio before TIS truncation), ``ent``
(entropy), ``adv`` (advantage), ``slr`` = the BF16 shadow's ``log r`` (its new vs old
log-prob of the same token, same weights) and ``mech``, the paper's mechanism token by
token: 1 clipped under FP8 but not under the BF16 shadow at the same bounds, 2 the
reverse, 3 both, 0 neither. Dumps without the shadow's fields (written before the trainer
recorded them, or by a backend that does not) have no shadow data: its quantities are
``null`` (``n/a`` on the page, which says "no shadow data"), never 0. Older dumps (format
1) lack the raw ratio, the bounds
and the clip side: the side follows from the advantage's sign, the bounds from
``fp8rl/clip_low``/``fp8rl/clip_high`` in ``metrics.jsonl``, ``tr`` from the old log-prob
when pi_old was the trainer's; what cannot be recovered is ``null``, shown as ``n/a``.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

import pandas as pd

from fp8rl.analysis.arms import DEFAULT_ROLLOUT, Arm, arm_of
from fp8rl.analysis.load import as_store, runs_frame
from fp8rl.rewards import extract_boxed, is_garbled, is_well_formed, repeat_4gram_frac
from fp8rl.runs import CorruptLogError, RunStore, atomic_write_text, read_step_log
from fp8rl.runs.store import METRICS_FILE

logger = logging.getLogger(__name__)

__all__ = [
    "AGAINST",
    "MECHANISM",
    "PAIR_COLUMNS",
    "QUANTITIES",
    "SUMMARY_COLUMNS",
    "Comparison",
    "Dump",
    "Quantity",
    "ViewerLink",
    "compare_page",
    "comparison_runs",
    "read_dumps",
    "response_view",
    "run_page",
    "run_view",
    "write_run_viewer",
    "write_viewers",
]

_DUMP_NAME = re.compile(r"^step_(\d+)\.json$")
_DIGITS = 4  # significant digits of the numbers a page embeds


@dataclass(frozen=True)
class Quantity:
    """A per-token quantity the page can colour by; ``kind`` says how (``category``:
    clip side; ``diverging``: symmetric around 0, lower side vermillion, upper blue;
    ``sequential``: 0 to ``hi``). ``hi`` is set per page from its tokens."""

    key: str
    label: str
    kind: str
    help: str
    hi: float | None = None


QUANTITIES: tuple[Quantity, ...] = (
    Quantity(
        "clip",
        "clipped at a bound",
        "category",
        "lower: A < 0 and r < L; upper: A > 0 and r > H. PPO zeroed the token's gradient",
    ),
    Quantity(
        "mech",
        "clipped: FP8 vs BF16 shadow",
        "category",
        "clipped at the step's bounds under this run's precision (r) and under its BF16 shadow "
        "(r_bf16: the same tokens and weights in BF16)",
    ),
    Quantity("lr", "log r (new vs old)", "diverging", "log pi_new - log pi_old at the last visit"),
    Quantity(
        "slr",
        "log r of the BF16 shadow",
        "diverging",
        "log pi_bf16(new) - log pi_bf16(old): the ratio BF16 would have clipped",
    ),
    Quantity(
        "tr",
        "trainer - rollout log-prob",
        "diverging",
        "log pi_old(trainer) - log pi_rollout: the log of the raw importance ratio",
    ),
    Quantity("ent", "entropy", "sequential", "entropy of the trainer's next-token distribution"),
    Quantity("adv", "advantage", "diverging", "the response's GRPO advantage"),
)

#: ``mech`` values: the token clipped under neither, FP8 (this run's precision) only, the
#: BF16 shadow only, or both, at the step's bounds.
MECHANISM = ("neither", "FP8 only", "BF16 shadow only", "both")

#: The summary table's columns: key in a response's ``summary``, heading, what it is.
SUMMARY_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("step", "step", "RL step of the dump"),
    ("question", "question", "the prompt's question"),
    ("length", "tokens", "response length in tokens"),
    ("reward", "reward", "the response's score (outcome reward plus any length shaping)"),
    ("correct", "correct", "the boxed answer is the gold answer"),
    ("boxed", "boxed", "a complete \\boxed{...} answer is present"),
    ("garbled", "garbled", "not well formed, or over half its character 4-grams repeated"),
    ("repeat", "repeat", "share of repeated character 4-grams"),
    ("adv", "A", "GRPO advantage"),
    ("clip_low", "clip low", "tokens clipped at the lower bound (A < 0, r < L)"),
    ("clip_high", "clip high", "tokens clipped at the upper bound (A > 0, r > H)"),
    ("clipped", "clipped", "share of the response's tokens clipped at either bound"),
    (
        "fp8_only",
        "FP8 only",
        "tokens clipped under FP8 that the BF16 shadow keeps inside the "
        "bounds (n/a: no shadow data)",
    ),
    (
        "bf16_only",
        "BF16 only",
        "tokens the BF16 shadow would clip that FP8 keeps inside the bounds (n/a: no shadow data)",
    ),
    ("entropy", "entropy", "mean token entropy"),
    ("max_abs_lr", "max |log r|", "largest |log r| of the response"),
)


@dataclass
class Dump:
    """One ``samples/step_<n>.json``: the step, its format (1 when the file does not say),
    the step-level fields (None when absent) and the responses as dumped."""

    step: int
    format: int
    clip_low: float | None
    clip_high: float | None
    tis_threshold: float | None
    loss: str | None
    samples: list[dict[str, Any]] = field(default_factory=list)


def read_dumps(run_dir: Path) -> list[Dump]:
    """The run's sample dumps in step order; an unreadable file is logged and left out."""
    folder = Path(run_dir) / "samples"
    paths = sorted(folder.iterdir()) if folder.is_dir() else []
    out = []
    for path in paths:
        match = _DUMP_NAME.match(path.name)
        if not match:
            continue
        try:
            raw = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            logger.warning("%s: unreadable sample dump (%s); left out", path, exc)
            continue
        out.append(
            Dump(
                step=int(raw.get("step", match.group(1))),
                format=int(raw.get("format", 1)),
                clip_low=raw.get("clip_low"),
                clip_high=raw.get("clip_high"),
                tis_threshold=raw.get("tis_threshold"),
                loss=raw.get("loss"),
                samples=list(raw.get("samples", [])),
            )
        )
    return out


def _num(value: Any) -> float | None:
    """A finite float rounded to the page's digits, or None."""
    if value is None or isinstance(value, bool):
        return None
    number = float(value)
    if not math.isfinite(number):
        return None
    return float(f"{number:.{_DIGITS}g}")


def _log(value: float | None) -> float | None:
    return None if value is None or value <= 0 else math.log(value)


def _token_columns(
    tokens: Sequence[Mapping[str, Any]], tis_threshold: float | None, trainer_old: bool
) -> dict[str, list[Any]]:
    """The per-token arrays of one response: the colour quantities and the hover numbers."""
    keys = ("t", "clip", "lr", "tr", "ent", "r", "is", "w", "rlp", "olp")
    cols: dict[str, list[Any]] = {
        k: [] for k in (*keys, "mech", "slr", "sr", "sclip", "solp", "slp")
    }
    for tok in tokens:
        adv, ratio = tok.get("advantage"), tok.get("ratio")
        if "clipped_low" in tok:
            side = 1 if tok["clipped_low"] else 2 if tok.get("clipped_high") else 0
        else:  # format 1: one flag; the sign of A says which bound clipped
            side = 0 if not tok.get("clipped") else 1 if (adv or 0) < 0 else 2
        is_ratio = tok.get("is_ratio")
        if is_ratio is None and trainer_old and "old_log_prob" in tok:
            is_ratio = math.exp(tok["old_log_prob"] - tok["rollout_log_prob"])
        cols["t"].append(str(tok.get("token", "")))
        cols["clip"].append(side)
        cols["lr"].append(_num(_log(ratio)))
        cols["tr"].append(_num(_log(is_ratio)))
        cols["ent"].append(_num(tok.get("entropy")))
        cols["r"].append(_num(ratio))
        cols["is"].append(_num(is_ratio))
        weight = None if is_ratio is None or tis_threshold is None else min(is_ratio, tis_threshold)
        cols["w"].append(_num(weight))
        cols["rlp"].append(_num(tok.get("rollout_log_prob")))
        cols["olp"].append(_num(tok.get("old_log_prob")))
        _shadow_columns(cols, tok, side)
    return cols


def _shadow_columns(cols: dict[str, list[Any]], tok: Mapping[str, Any], side: int) -> None:
    """The BF16 shadow's per-token values (None without shadow data) and ``mech``."""
    if "shadow_clipped_low" not in tok:
        for key in ("mech", "slr", "sr", "sclip", "solp", "slp"):
            cols[key].append(None)
        return
    shadow_side = 1 if tok["shadow_clipped_low"] else 2 if tok.get("shadow_clipped_high") else 0
    ratio = tok.get("shadow_ratio")
    cols["mech"].append(int(side > 0) + 2 * int(shadow_side > 0))
    cols["slr"].append(_num(_log(ratio)))
    cols["sr"].append(_num(ratio))
    cols["sclip"].append(shadow_side)
    cols["solp"].append(_num(tok.get("shadow_old_log_prob")))
    cols["slp"].append(_num(tok.get("shadow_log_prob")))


def _summary(sample: Mapping[str, Any], step: int, cols: Mapping[str, list[Any]]) -> dict:
    """The response's summary strip (:data:`SUMMARY_COLUMNS`)."""
    text = str(sample.get("response", ""))
    tokens = sample.get("tokens", [])
    n = len(tokens)
    low, high = cols["clip"].count(1), cols["clip"].count(2)
    shadow = n > 0 and None not in cols["mech"]
    entropies = [v for v in cols["ent"] if v is not None]
    log_ratios = [abs(v) for v in cols["lr"] if v is not None]
    return {
        "step": step,
        "prompt": sample.get("id"),
        "question": sample.get("question"),
        "row": sample.get("row"),
        "length": n,
        "reward": _num(sample.get("score")),
        "correct": sample.get("correct"),
        "boxed": extract_boxed(text) is not None,
        "well_formed": is_well_formed(text),
        "garbled": is_garbled(text),
        "repeat": _num(repeat_4gram_frac(text)),
        "adv": _num(tokens[0].get("advantage")) if tokens else None,
        "clip_low": low,
        "clip_high": high,
        "clipped": _num((low + high) / n) if n else None,
        "shadow": shadow,
        "fp8_only": cols["mech"].count(1) if shadow else None,
        "bf16_only": cols["mech"].count(2) if shadow else None,
        "entropy": _num(sum(entropies) / len(entropies)) if entropies else None,
        "max_abs_lr": _num(max(log_ratios)) if log_ratios else None,
        "finished": sample.get("finished"),
        "minibatch": sample.get("minibatch"),
    }


def response_view(sample: Mapping[str, Any], dump: Dump, *, trainer_old: bool) -> dict[str, Any]:
    """One dumped response as the page needs it: who it is, its summary, its token arrays.
    ``trainer_old``: the run's pi_old was the trainer's (then a format-1 dump's old minus
    rollout log-prob is the raw importance ratio's log)."""
    cols = _token_columns(sample.get("tokens", []), dump.tis_threshold, trainer_old)
    return {
        "step": dump.step,
        "prompt": sample.get("id"),
        "question": sample.get("question"),
        "answer": sample.get("answer"),
        "text": sample.get("response"),
        "summary": _summary(sample, dump.step, cols),
        **cols,
    }


def _logged_bounds(run_dir: Path, steps: Iterable[int]) -> dict[int, tuple[Any, Any]]:
    """``fp8rl/clip_low``/``fp8rl/clip_high`` of ``steps`` from the run's metrics.jsonl."""
    wanted = set(steps)
    try:
        records = read_step_log(Path(run_dir) / METRICS_FILE).records
    except (CorruptLogError, OSError, ValueError):
        return {}
    return {
        r["step"]: (r["data"].get("fp8rl/clip_low"), r["data"].get("fp8rl/clip_high"))
        for r in records
        if r["step"] in wanted
    }


def run_view(run_dir: Path, config: Mapping[str, Any], run_id: str, experiment: str) -> dict:
    """A run's dumps as the page's data: the run's label and steps, each step's bounds,
    dump format and FP8-only / BF16-only clip counts (None: no shadow data), and its
    responses in dump order (step, then batch row)."""
    dumps = read_dumps(run_dir)
    logged = _logged_bounds(run_dir, [d.step for d in dumps if d.clip_low is None])
    train = config.get("train") or {}
    trainer_old = train.get("old_logprob_source", "trainer") == "trainer"
    steps, responses = {}, []
    for dump in dumps:
        low, high = (dump.clip_low, dump.clip_high)
        if low is None:
            low, high = logged.get(dump.step, (None, None))
        views = [response_view(s, dump, trainer_old=trainer_old) for s in dump.samples]
        summaries = [v["summary"] for v in views if v["summary"]["length"]]
        shadow = bool(summaries) and all(s["shadow"] for s in summaries)
        steps[str(dump.step)] = {
            "format": dump.format,
            "clip_low": _num(low),
            "clip_high": _num(high),
            "loss": dump.loss,
            "tis_threshold": dump.tis_threshold,
            "responses": len(dump.samples),
            "shadow": shadow,
            "fp8_only": sum(s["fp8_only"] for s in summaries) if shadow else None,
            "bf16_only": sum(s["bf16_only"] for s in summaries) if shadow else None,
        }
        responses += views
    arm, seed = arm_of(config), config.get("seed")
    return {
        "run_id": run_id,
        "experiment": experiment,
        "arm": arm,
        "seed": seed,
        "label": f"{arm}, seed {seed}",
        "steps": steps,
        "responses": responses,
    }


def _scaled_quantities(runs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """:data:`QUANTITIES` with ``hi`` from the page's tokens: the 99th percentile of
    ``|value|`` (at least 1e-3), so one outlier does not wash the rest out."""
    out = []
    for q in QUANTITIES:
        hi = None
        if q.kind != "category":
            key = "summary" if q.key == "adv" else q.key
            values = []
            for run in runs:
                for resp in run["responses"]:
                    if q.key == "adv":
                        values += [resp[key]["adv"]] * len(resp["t"])
                    else:
                        values += resp[key]
            present = sorted(abs(v) for v in values if v is not None)
            top = present[min(len(present) - 1, int(0.99 * len(present)))] if present else 1.0
            hi = _num(max(top, 1e-3))
        out.append(asdict(Quantity(q.key, q.label, q.kind, q.help, hi)))
    return out


def _render(data: Mapping[str, Any]) -> str:
    """The page: the template with the style, the script and the data inlined (``<`` in
    the JSON escaped, so no text in a response can end the script element)."""
    files = resources.files("fp8rl.analysis")
    page = (files / "viewer.html").read_text(encoding="utf-8")
    payload = json.dumps(data, separators=(",", ":"), allow_nan=False).replace("<", "\\u003c")
    title = str(data["title"]).replace("&", "&amp;").replace("<", "&lt;")
    return (
        page.replace("{{TITLE}}", title)
        .replace("/*{{CSS}}*/", (files / "viewer.css").read_text(encoding="utf-8"))
        .replace("/*{{JS}}*/", (files / "viewer.js").read_text(encoding="utf-8"))
        .replace("{{DATA}}", payload)
    )


def _page_data(mode: str, title: str, runs: list[dict], **extra: Any) -> dict[str, Any]:
    """The page's data; it opens coloured by the mechanism (``mech``) when any run on it
    has shadow data, else by the clip side."""
    shadow = any(info["shadow"] for run in runs for info in run["steps"].values())
    return {
        "mode": mode,
        "title": title,
        "runs": runs,
        "quantities": _scaled_quantities(runs),
        "columns": [list(c) for c in SUMMARY_COLUMNS],
        "mechanism": list(MECHANISM),
        "colour": "mech" if shadow else "clip",
        **extra,
    }


def _view(store: RunStore, experiment: str, run_id: str) -> dict[str, Any]:
    info = store.run_info(experiment, run_id)
    return run_view(info.path, info.config, run_id, experiment)


def run_page(source: RunStore | Path | str, experiment: str, run_id: str) -> str:
    """The HTML page of one run's sample dumps."""
    view = _view(as_store(source), experiment, run_id)
    return _render(_page_data("run", f"Token viewer: {view['label']} ({run_id})", [view]))


#: The comparison page's table: one row per prompt pair (key, heading, what it is).
PAIR_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("step", "step", "RL step of the dumps"),
    ("question", "question", "the prompt's question"),
    ("left_clip_low", "left: clip low", "left run: tokens clipped at the lower bound"),
    ("right_clip_low", "right: clip low", "right run: tokens clipped at the lower bound"),
    (
        "left_fp8_only",
        "left: FP8 only",
        "left run: tokens clipped that its BF16 shadow keeps "
        "inside the bounds (n/a: no shadow data)",
    ),
    (
        "right_fp8_only",
        "right: FP8 only",
        "right run: tokens clipped that its BF16 shadow "
        "keeps inside the bounds (n/a: no shadow data)",
    ),
    ("left_garbled", "left: garbled", "left run: garbled responses"),
    ("right_garbled", "right: garbled", "right run: garbled responses"),
    ("left_reward", "left: reward", "left run: mean reward"),
    ("right_reward", "right: reward", "right run: mean reward"),
)


def _side_summary(responses: Sequence[Mapping[str, Any]], side: str) -> dict[str, Any]:
    rewards = [r["summary"]["reward"] for r in responses if r["summary"]["reward"] is not None]
    fp8_only = [r["summary"]["fp8_only"] for r in responses]
    return {
        f"{side}_clip_low": sum(r["summary"]["clip_low"] for r in responses),
        f"{side}_fp8_only": None if None in fp8_only else sum(fp8_only),
        f"{side}_garbled": sum(bool(r["summary"]["garbled"]) for r in responses),
        f"{side}_reward": _num(sum(rewards) / len(rewards)) if rewards else None,
    }


def _pairs(left: Mapping[str, Any], right: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The (step, prompt) both runs dumped, in step then left-run order: each side's
    response indices and the pair's summary (:data:`PAIR_COLUMNS`)."""
    right_at: dict[tuple[int, str], list[int]] = {}
    for j, resp in enumerate(right["responses"]):
        right_at.setdefault((resp["step"], resp["prompt"]), []).append(j)
    pairs: dict[tuple[int, str], dict[str, Any]] = {}
    for i, resp in enumerate(left["responses"]):
        key = (resp["step"], resp["prompt"])
        if key in right_at:
            pair = pairs.setdefault(key, {"step": key[0], "prompt": key[1], "left": []})
            pair["left"].append(i)
            pair["right"] = right_at[key]
    for pair in pairs.values():
        pair["summary"] = {
            "step": pair["step"],
            "prompt": pair["prompt"],
            "question": left["responses"][pair["left"][0]]["question"],
            **_side_summary([left["responses"][i] for i in pair["left"]], "left"),
            **_side_summary([right["responses"][j] for j in pair["right"]], "right"),
        }
    return list(pairs.values())


def compare_page(
    source: RunStore | Path | str, experiment: str, left_id: str, right_id: str
) -> str:
    """The HTML page of two runs side by side: every (step, prompt) both dumped."""
    store = as_store(source)
    left, right = _view(store, experiment, left_id), _view(store, experiment, right_id)
    pairs = _pairs(left, right)
    unpaired = [
        sum(1 for r in run["responses"] if (r["step"], r["prompt"]) not in paired)
        for run, paired in (
            (left, {(p["step"], p["prompt"]) for p in pairs}),
            (right, {(p["step"], p["prompt"]) for p in pairs}),
        )
    ]
    title = f"Token viewer: {left['label']} vs {right['label']}"
    extra = {"pairs": pairs, "unpaired": unpaired, "pair_columns": [list(c) for c in PAIR_COLUMNS]}
    return _render(_page_data("compare", title, [left, right], **extra))


@dataclass(frozen=True)
class ViewerLink:
    """A page :func:`write_viewers` wrote: what it shows, and its path."""

    label: str
    path: Path


#: What a comparison puts next to plain FP8 (:attr:`Comparison.against`).
AGAINST = ("bf16", "cc")


@dataclass(frozen=True)
class Comparison:
    """Two runs the report puts side by side: plain FP8 of one granularity and seed, and
    its BF16 twin (``against="bf16"``: the ``BF16`` arm, same seed) or FP8 + CC of the
    same granularity (``against="cc"``)."""

    granularity: str
    seed: int
    left: str  # run id, plain FP8
    right: str  # run id, BF16 or FP8 + CC
    against: str = "cc"

    @property
    def label(self) -> str:
        left, right = _pair(self.granularity, self.against)
        return f"{left} vs {right}, seed {self.seed}"

    @property
    def file_name(self) -> str:
        vs = "_vs_bf16" if self.against == "bf16" else ""
        return f"compare_{self.granularity}{vs}_seed{self.seed}.html"


def _pair(granularity: str, against: str) -> tuple[str, str]:
    """The labels of plain FP8 of ``granularity`` and of what it is compared with."""
    plain = Arm(granularity, DEFAULT_ROLLOUT.get(granularity))
    other = Arm("bf16") if against == "bf16" else replace(plain, calibrated=True)
    return plain.label, other.label


def comparison_runs(runs: pd.DataFrame) -> list[Comparison]:
    """Plain FP8 against its BF16 twin and against FP8 + CC, for every granularity and seed
    that has both arms of a pair (a usable run preferred); per granularity and seed the
    BF16 pair first."""
    out = []
    ordered = runs.sort_values("usable", ascending=False, kind="stable")
    for granularity in DEFAULT_ROLLOUT:
        plain = _pair(granularity, "cc")[0]
        for seed in sorted(ordered.loc[ordered["arm"] == plain, "seed"].dropna().unique()):
            a = ordered[(ordered["arm"] == plain) & (ordered["seed"] == seed)]
            for against in AGAINST:
                other = _pair(granularity, against)[1]
                b = ordered[(ordered["arm"] == other) & (ordered["seed"] == seed)]
                if len(a) and len(b):
                    ids = (str(a.iloc[0]["run_id"]), str(b.iloc[0]["run_id"]))
                    out.append(Comparison(granularity, int(seed), *ids, against))
    return out


def write_viewers(
    source: RunStore | Path | str, experiment: str, runs: pd.DataFrame, out_dir: Path | str
) -> list[ViewerLink]:
    """Write ``<out_dir>/<run_id>.html`` for every run in ``runs`` with sample dumps and
    ``<out_dir>/compare_<granularity>_vs_bf16_seed<seed>.html`` (FP8 vs its BF16 twin) and
    ``<out_dir>/compare_<granularity>_seed<seed>.html`` (FP8 vs FP8 + CC) for each of
    :func:`comparison_runs` whose runs both have dumps; remove pages of an earlier build
    that were not written again. Returns the pages, runs first."""
    store, out = as_store(source), Path(out_dir)
    links: list[ViewerLink] = []
    dumped = set()
    for row in runs.itertuples():
        if not read_dumps(store.run_path(experiment, row.run_id)):
            continue
        dumped.add(row.run_id)
        path = out / f"{row.run_id}.html"
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, run_page(store, experiment, row.run_id))
        links.append(ViewerLink(f"{row.arm}, seed {row.seed} ({row.run_id})", path))
    for pair in comparison_runs(runs[runs["run_id"].isin(dumped)]):
        path = out / pair.file_name
        atomic_write_text(path, compare_page(store, experiment, pair.left, pair.right))
        links.append(ViewerLink(pair.label, path))
    written = {link.path for link in links}
    for stale in out.glob("*.html") if out.is_dir() else []:
        if stale not in written:
            stale.unlink()
    return links


def write_run_viewer(run_dir: Path | str, out_dir: Path | str) -> list[ViewerLink]:
    """The pages of one run, without the rest of the report: ``<out_dir>/<run_id>.html``,
    and each of :func:`comparison_runs` of its experiment that holds the run (plain FP8
    against its BF16 twin, against FP8 + CC) when the other run dumped samples too.
    ``run_dir`` is ``<store>/<experiment>/<run_id>``. Returns the pages, the run's first;
    raises FileNotFoundError when the run has no sample dumps."""
    run_dir = Path(run_dir)
    store, experiment, run_id = RunStore(run_dir.parent.parent), run_dir.parent.name, run_dir.name
    if not read_dumps(store.run_path(experiment, run_id)):
        raise FileNotFoundError(
            f"{run_dir}: no sample dumps in samples/ (run with train.dump_samples_every > 0)"
        )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{run_id}.html"
    atomic_write_text(path, run_page(store, experiment, run_id))
    config = store.run_info(experiment, run_id).config
    links = [ViewerLink(f"{arm_of(config)}, seed {config.get('seed')} ({run_id})", path)]
    for pair in comparison_runs(runs_frame(store, experiment)):
        other = {pair.left: pair.right, pair.right: pair.left}.get(run_id)
        if other is None or not read_dumps(store.run_path(experiment, other)):
            continue
        path = out / pair.file_name
        atomic_write_text(path, compare_page(store, experiment, pair.left, pair.right))
        links.append(ViewerLink(pair.label, path))
    return links
