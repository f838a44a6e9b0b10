"""Every task file runs through lm-eval on a fixture with ``limit`` and scores known
responses as it should: a stand-in model (an lm-eval ``LM``) answers each problem's k
samples right, wrong, right, so avg@k must be 2/3 and pass@k 1 on every benchmark — which
also shows that all k samples are scored (lm-eval's default filter keeps only the first).
The math fixtures are made-up problems in the schema, with answers in other forms than the
gold's (0.75 for \\frac{3}{4}, \\sqrt{8} for 2\\sqrt{2})."""

from __future__ import annotations

import json
from collections import Counter

import lm_eval
import pytest
from lm_eval.api.model import LM
from lm_eval.tasks import TaskManager

from fp8rl.evaluation.benchmarks import BENCHMARKS, TINY_BENCHMARKS, TINY_EVAL_DIR
from fp8rl.evaluation.runner import TASKS_DIR, plan_tasks, write_task_dir
from fp8rl.evaluation.settings import LmEvalSettings

#: gold -> (an equivalent form the model writes, a wrong answer)
FORMS = {"\\frac{3}{4}": ("0.75", "0.7"), "204": ("204", "240"), "2\\sqrt{2}": ("\\sqrt{8}", "8")}
K, LIMIT = 3, 2


class RightWrongRight(LM):
    """Answers sample j of a problem right when j is even; wrong answers of math problems
    also drop the box (a response without an answer)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: Counter[str] = Counter()
        self.contexts: list[str] = []
        self.do_sample: set[bool] = set()

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        out = []
        for request in requests:
            doc, (context, gen_kwargs) = request.doc, request.args
            self.contexts.append(context)
            assert gen_kwargs["until"] == []
            self.do_sample.add(gen_kwargs["do_sample"])
            j = self.seen[context]
            self.seen[context] += 1
            if "problem" in doc:  # a math benchmark
                right, wrong = FORMS[doc["answer"]]
                out.append(f"... \\boxed{{{right}}}" if j % 2 == 0 else f"maybe {wrong}")
            else:
                gold = int(doc["answer"])
                out.append(f"\\boxed{{{gold if j % 2 == 0 else gold + 1}}}")
        return out

    def loglikelihood(self, requests, disable_tqdm: bool = False):
        raise NotImplementedError

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
        raise NotImplementedError


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("benchmarks")
    for name in BENCHMARKS:
        rows = [
            {"id": f"{name}-{i}", "problem": f"Made-up problem {i} of {name}: find x.",
             "answer": gold, "source": name}
            for i, gold in enumerate(FORMS)
        ]  # fmt: skip
        (root / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def test_every_task_file_scores_all_k_samples(tmp_path, data_root) -> None:
    settings = LmEvalSettings(k=K, greedy=False, limit=LIMIT, max_gen_toks=16)
    names = [*TINY_BENCHMARKS, *BENCHMARKS]
    plans = plan_tasks(names, settings, data_root=data_root)
    task_dir = write_task_dir(plans, settings, tmp_path / "tasks", cache_dir=tmp_path / "c")
    model = RightWrongRight()
    results = lm_eval.simple_evaluate(  # the runner's task files: include + absolute paths
        model=model,
        tasks=[p.task for p in plans],
        task_manager=TaskManager(include_path=str(task_dir), include_defaults=False),
        samples={p.task: p.indices for p in plans if p.indices is not None},
        log_samples=True,
    )
    assert len(plans) == len(TINY_BENCHMARKS) + len(BENCHMARKS) == 17
    assert model.do_sample == {True}  # sampled, in every request
    for plan in plans:
        task = results["results"][plan.task]
        assert task["sample_len"] == LIMIT, plan.task
        assert task["acc,keep_all"] == pytest.approx(2 / 3), plan.task
        assert task["pass_at_k,keep_all"] == 1.0, plan.task
        boxed = 1.0 if plan.kind == "tiny" else 2 / 3
        assert task["boxed,keep_all"] == pytest.approx(boxed), plan.task
        sample = results["samples"][plan.task][0]
        assert len(sample["filtered_resps"][0]) == K  # every sample kept and scored
    assert set(model.seen.values()) == {K}
    # the prompts are the shared templates
    assert "Compute 47+12.\n" in model.contexts
    assert any(c.endswith("output the final answer within \\boxed{}.") for c in model.contexts)


def test_the_committed_task_files_run_as_they_are_with_lm_evals_limit(
    tmp_path, data_root, monkeypatch
) -> None:
    """``lm_eval --include_path fp8rl/evaluation/tasks --tasks fp8rl_tiny,fp8rl_math --limit 2``
    from a checkout: the committed files' relative data paths, greedy, one sample each."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "tiny_eval").symlink_to(TINY_EVAL_DIR)
    (tmp_path / "data" / "benchmarks").symlink_to(data_root)
    monkeypatch.chdir(tmp_path)
    model = RightWrongRight()
    results = lm_eval.simple_evaluate(
        model=model,
        tasks=["fp8rl_tiny", "fp8rl_math", "fp8rl_gsm8k", "fp8rl_hmmt_feb25", "fp8rl_brumo25"],
        task_manager=TaskManager(include_path=str(TASKS_DIR), include_defaults=False),
        limit=2,
    )
    tasks = {k: v for k, v in results["results"].items() if k.startswith("fp8rl_")}
    assert {"fp8rl_tiny", "fp8rl_math"} <= set(tasks) and len(tasks) == 2 + 17
    for name, task in tasks.items():  # the one greedy sample is the right one
        assert task["acc,keep_all"] == 1.0, name
    assert results["configs"]["fp8rl_tiny_add_sub"]["repeats"] == 1
    assert model.do_sample == {False}  # the committed files decode greedily
