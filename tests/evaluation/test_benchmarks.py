"""eval.benchmarks: lm-evaluation-harness tasks on the live model, as rows with intervals and per-document outcomes.

One tiny run (shared by the tests here) evaluates the shipped offline ``world_mc`` and a user-style YAML task over a
jsonl this file writes; its logged values must equal lm-eval's own ``simple_evaluate`` on the same weights."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from harness.config import ConfigError, validate_data
from tests.conftest import TINY, invoke, run_cli, write_yaml

lm_eval = pytest.importorskip("lm_eval")

USER_TASK = """\
task: my_facts
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
"""


def _user_task(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    rows = [
        {"question": f"Is {a} plus {b} equal to", "choices": [str(a + b), str(a + b + 1), str(a * b + 3)], "answer": 0}
        for a in range(4)
        for b in range(3)
    ]
    data = directory / "facts.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (directory / "my_facts.yaml").write_text(USER_TASK.format(data=data))
    return directory


def _experiment(tmp: Path, benchmarks: list[dict] | None) -> dict:
    exp = json.loads(json.dumps(TINY))
    if benchmarks is not None:
        exp["eval"]["benchmarks"] = benchmarks
    return exp


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("bench")
    tasks = _user_task(tmp / "tasks")
    exp = _experiment(tmp, [{"task": "world_mc", "limit": 16}, {"task": "my_facts", "include_path": str(tasks)}])
    out = tmp / "run"
    result = invoke("run", str(write_yaml(tmp / "exp.yaml", exp)), "--out", str(out))  # in process: reads its outputs
    assert result.exit_code == 0, result.output[-4000:]
    return out


def _bench_rows(run: Path) -> pl.DataFrame:
    return pl.read_parquet(run / "metrics.parquet").filter(pl.col("split") == "bench")


def test_shipped_benchmark_logged_at_the_start_and_every_stage_end_with_intervals(bench_run):
    rows = _bench_rows(bench_run).filter(pl.col("task") == "bench:world_mc")
    # stages a (steps 0-4) and b (4-8, init previous: its first rows repeat a's last): start, a's end, b's end
    assert rows.select("stage", "step").rows() == [("a", 0), ("a", 4), ("b", 4), ("b", 8)]
    assert set(rows["metric"]) == {"acc"}
    for r in rows.iter_rows(named=True):
        assert r["n"] == 16 and r["ci_low"] <= r["value"] <= r["ci_high"] and r["ci_high"] - r["ci_low"] > 0.2
    summary = json.loads((bench_run / "summary.json").read_text())
    last = summary["stages"][-1]
    assert last["metrics"]["bench"]["bench:world_mc"]["acc"] == rows["value"][-1]
    assert last["intervals"]["bench"]["bench:world_mc"]["acc"]["n"] == 16


def test_logged_user_task_equals_lm_evals_own_simple_evaluate(bench_run):
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager
    from transformers import AutoModelForCausalLM, AutoTokenizer

    checkpoint = bench_run / "checkpoints" / "b"  # the last stage's end: the weights of the last evaluation
    model = AutoModelForCausalLM.from_pretrained(checkpoint)
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    lm = HFLM(
        pretrained=model,
        tokenizer=tokenizer,
        batch_size=TINY.get("eval", {}).get("batch_size", 64),
        max_length=model.config.max_position_embeddings,
    )
    reference = simple_evaluate(
        model=lm,
        tasks=["my_facts"],
        log_samples=True,
        task_manager=TaskManager(include_path=str(bench_run.parent / "tasks")),
    )
    expected = reference["results"]["my_facts"]["acc,none"]
    logged = _bench_rows(bench_run).filter(
        (pl.col("task") == "bench:my_facts") & (pl.col("step") == 8) & (pl.col("stage") == "b")
    )
    assert logged["value"].to_list() == [expected]
    assert logged["n"].to_list() == [12]
    # per-document outcomes in samples.jsonl: lm-eval's own, document by document (the paired seesaw's data)
    samples = [json.loads(line) for line in (bench_run / "samples.jsonl").read_text().splitlines()]
    ours = {
        s["index"]: s["outcomes"]["acc"]
        for s in samples
        if s["task"] == "bench:my_facts" and s["step"] == 8 and s["stage"] == "b"
    }
    theirs = {d["doc_id"]: int(d["acc"]) for d in reference["samples"]["my_facts"]}
    assert ours == theirs


def test_a_benchmark_changes_only_evaluation_rows(bench_run, tmp_path):
    """lm-eval seeds python, numpy and torch: the run restores them, so training and our own evaluations are the
    same with and without benchmarks (the bench rows are added, and the seesaw's tests include theirs)."""
    out = tmp_path / "plain"
    result = run_cli("run", str(write_yaml(tmp_path / "exp.yaml", _experiment(tmp_path, None))), "--out", str(out))
    assert result.returncode == 0, result.stderr[-4000:]
    keep = ["stage", "step", "task", "split", "metric", "value"]
    # the seesaw's paired tests include the benchmarks' (one BH family): its rows are the other thing that changes
    numeric = (
        (pl.col("split") != "bench")
        & ~pl.col("metric").is_in(["seesaw", "seesaw_tests"])
        & ~pl.col("metric").str.contains("seconds|_s$|time")
    )
    with_bench = pl.read_parquet(bench_run / "metrics.parquet").filter(numeric).select(keep)
    without = pl.read_parquet(out / "metrics.parquet").filter(numeric).select(keep)
    assert with_bench.filter(pl.col("metric") == "loss").height > 0
    assert with_bench.sort(keep[:5]).equals(without.sort(keep[:5]))


def test_config_errors_name_the_field(tmp_path, monkeypatch):
    exp = _experiment(
        tmp_path,
        [{"task": "world_mc", "every": 6}, {"task": "x", "include_path": str(tmp_path / "no")}, {"task": "world_mc"}],
    )
    with pytest.raises(ConfigError) as e:
        validate_data(exp)
    assert sorted(p for p, _ in e.value.errors) == [
        "eval.benchmarks[0].every",
        "eval.benchmarks[1].include_path",
        "eval.benchmarks[2].task",
    ]
    import harness.config.load as load

    monkeypatch.setattr(load, "lm_eval_installed", lambda: False)
    with pytest.raises(ConfigError) as e:
        validate_data(_experiment(tmp_path, [{"task": "world_mc"}]))
    assert e.value.errors == [
        (
            "eval.benchmarks",
            "needs lm-evaluation-harness (lm-eval 0.4.x), which is not installed: pip install -e '.[benchmarks]'",
        )
    ]


def test_missing_lm_eval_exits_2_with_one_line(tmp_path):
    """Hide lm_eval from the child process: a one-line error naming eval.benchmarks, exit 2, before any training."""
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text(
        "import importlib.util, sys\n_find = importlib.util.find_spec\n"
        "importlib.util.find_spec = lambda name, *a, **k: None if name == 'lm_eval' else _find(name, *a, **k)\n"
    )
    import os

    exp = write_yaml(tmp_path / "exp.yaml", _experiment(tmp_path, [{"task": "world_mc"}]))
    result = run_cli("validate", str(exp), env={"PYTHONPATH": f"{hide}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"})
    assert result.returncode == 2, result.stdout + result.stderr
    lines = [line for line in (result.stdout + result.stderr).splitlines() if "eval.benchmarks" in line]
    assert len(lines) == 1 and "pip install -e '.[benchmarks]'" in lines[0]


def test_unknown_task_names_its_field(tmp_path):
    from data_recipes import build_world
    from harness.config import validate_data as validate
    from harness.runs.execution.evallog import make_benchmarks

    exp = validate(
        _experiment(
            tmp_path, [{"task": "world_mc"}, {"task": "my_fact", "include_path": str(_user_task(tmp_path / "tasks"))}]
        )
    )
    with pytest.raises(ConfigError) as e:
        make_benchmarks(exp.eval, exp.name, build_world(10, 0), None, tmp_path / "run", [4, 4])
    assert e.value.errors == [("eval.benchmarks[1].task", "unknown lm-eval task 'my_fact' (did you mean 'my_facts'?)")]


def test_benchmarks_stay_out_of_dumps_unless_set(tmp_path):
    """Existing experiments dump (and so key the stage cache) exactly as before the field existed."""
    plain = validate_data(_experiment(tmp_path, None))
    assert "benchmarks" not in plain.resolved_dict()["eval"]
    assert validate_data(_experiment(tmp_path, [{"task": "world_mc"}])).resolved_dict()["eval"]["benchmarks"] == [
        {"task": "world_mc", "include_path": None, "limit": None, "num_fewshot": None, "every": "stage_end"}
    ]


def test_world_rows_are_seeded_four_option_questions():
    from data_recipes import build_world
    from data_recipes.world_bench import world_gen_rows, world_mc_rows

    world = build_world(30, 1)
    rows = world_mc_rows(world, 40)
    assert rows == world_mc_rows(world, 40) and len(rows) == 40
    for r in rows:
        person = world.person(r["person"])
        truth = getattr(person, r["attribute"])
        assert len(set(r["choices"])) == 4 and r["choices"][r["answer"]].endswith(truth)
        assert person.name in r["context"]
    assert {r["answer"] for r in rows} == {0, 1, 2, 3}  # the true answer's position varies
    gen = world_gen_rows(world, 10)
    assert all(r["answer"] == str(world.person(r["person"]).birth_year) for r in gen)


def _outcomes(step: int, stage: str, task: str, split: str, metric: str, ones: int, n: int = 40) -> dict:
    return {
        "step": step,
        "stage": stage,
        "task": task,
        "split": split,
        "metric": metric,
        "outcomes": {i: int(i < ones) for i in range(n)},
    }


def test_paired_seesaw_pairs_a_falling_benchmark_with_a_rising_task():
    """Benchmarks run at stage edges only (steps 0 and 8), the tasks also at step 4: a task that rises over 0 → 8
    while the benchmark falls is an event of the benchmark family; no change, no event."""
    from harness.evaluation.evidence import BENCH_FAMILY, run_seesaw

    def run(bench_after: int) -> list[dict]:
        rows = [
            _outcomes(0, "a", "yesno", "heldout", "greedy", 4),
            _outcomes(4, "a", "yesno", "heldout", "greedy", 20),
            _outcomes(8, "a", "yesno", "heldout", "greedy", 36),
            _outcomes(0, "a", "math", "heldout", "greedy", 10),
            _outcomes(4, "a", "math", "heldout", "greedy", 10),
            _outcomes(8, "a", "math", "heldout", "greedy", 10),
            _outcomes(0, "a", "bench:world_mc", "bench", "acc", 30),
            _outcomes(8, "a", "bench:world_mc", "bench", "acc", bench_after),
        ]
        events, n_tests = run_seesaw(rows, [], test="paired", delta=0.15, alpha=0.05, seed=0)
        assert n_tests == 4 + 3  # yesno and math at 0→4, 4→8; the family at 0→8: yesno, math, world_mc
        return events

    [event] = run(bench_after=5)
    assert (event["metric"], event["rose"], event["fell"]) == (BENCH_FAMILY, "yesno/heldout", "bench:world_mc/acc")
    assert event["step_from"] == 0 and event["step_to"] == 8 and event["p_value"] < 0.05
    assert run(bench_after=30) == []


def test_run_report_shows_the_benchmark_and_yes_no_ranking_curves(bench_run, tmp_path):
    from analysis.report import run_report

    page = run_report(bench_run, tmp_path / "report").read_text()
    assert "bench_acc.png" in page and "curves_choice_auc.png" in page and "curves_choice_yes.png" in page
    assert (tmp_path / "report" / "bench_acc.png").stat().st_size > 0


def test_running_benchmarks_leaves_random_states_and_module_modes_as_they_were(bench_run):
    """simple_evaluate seeds python, numpy and torch (1234); mid-training that would change what follows (adapter
    initialisation, sampling): Benchmarks.run restores all three, and every module's train/eval mode."""
    import random

    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from harness.config import validate_data as validate
    from harness.evaluation.benchmarks import Benchmarks

    checkpoint = bench_run / "checkpoints" / "b"
    model = AutoModelForCausalLM.from_pretrained(checkpoint).train()
    model.lm_head.eval()  # a module frozen in eval mode stays so
    exp = validate(_experiment(bench_run, [{"task": "my_facts", "include_path": str(bench_run.parent / "tasks")}]))
    bench = Benchmarks(
        exp.eval.benchmarks, [str(bench_run.parent / "tasks")], AutoTokenizer.from_pretrained(checkpoint)
    )
    torch.manual_seed(7), np.random.seed(7), random.seed(7)
    expected = (torch.rand(3), np.random.rand(3), random.random())
    torch.manual_seed(7), np.random.seed(7), random.seed(7)
    result = bench.run(model)
    assert [r[:3] for r in result.rows] == [("bench:my_facts", "bench", "acc")]
    after = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(after[0], expected[0]) and np.array_equal(after[1], expected[1]) and after[2] == expected[2]
    assert model.training and model.model.training and not model.lm_head.training


def test_result_rows_of_a_two_filter_generation_task_and_a_stderr_metric():
    """As gsm8k logs it: two filters (no "none"), one record per document carrying both filters' outcomes; a
    metric that is not 0/1 per document gets lm-eval's stderr interval."""
    from harness.evaluation.benchmarks import result_rows

    def doc(i: int, flt: str, em: float, score: float) -> dict:
        return {
            "doc_id": i,
            "filter": flt,
            "target": "42",
            "arguments": [["Q?", {}]],
            "filtered_resps": ["42"],
            "exact_match": em,
            "score": score,
        }

    docs = [doc(i, f, float(i % 2 if f == "strict" else 1), 0.5 * i) for f in ("strict", "flex") for i in range(4)]
    results = {
        "results": {
            "g": {
                "alias": "g",
                "exact_match,strict": 0.5,
                "exact_match_stderr,strict": 0.29,
                "exact_match,flex": 1.0,
                "exact_match_stderr,flex": 0.0,
                "score,strict": 0.75,
                "score_stderr,strict": 0.1,
                "score,flex": "N/A",
            }
        },
        "samples": {"g": docs},
    }
    rows, samples = result_rows(results)
    by_metric = {r[2]: r for r in rows}
    assert set(by_metric) == {"exact_match:strict", "exact_match:flex", "score:strict"}
    assert by_metric["exact_match:strict"][4] == 4 and by_metric["exact_match:strict"][5] < 0.5  # Wilson, n = 4
    assert by_metric["score:strict"][4:] == pytest.approx((4, 0.75 - 1.96 * 0.1, 0.75 + 1.96 * 0.1), abs=1e-3)
    assert [s["index"] for s in samples] == [0, 1, 2, 3]
    assert samples[1]["outcomes"] == {"exact_match:strict": 1, "exact_match:flex": 1}
