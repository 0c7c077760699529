"""What a person watching sees when stderr is a file: plain progress lines and one line per split per evaluation."""

from __future__ import annotations

import re
from types import SimpleNamespace

from harness.runs.execution.console import PlainProgress, evaluation_lines
from tests.conftest import run_cli, write_yaml


def test_plain_progress_prints_every_tenth_and_at_the_end():
    lines: list[str] = []
    advance = PlainProgress("stage", 25, lines.append, every_s=1e9)
    for _ in range(25):
        advance(1)
    assert [re.match(r"stage: (\d+)/25 steps", line).group(1) for line in lines] == [
        "2",
        "4",
        "6",
        "8",
        "10",
        "12",
        "14",
        "16",
        "18",
        "20",
        "22",
        "24",
        "25",
    ]


def test_evaluation_lines_show_the_main_score_n_and_an_interval_when_given():
    def row(task, split, metric, value, **extra):
        return SimpleNamespace(task=task, split=split, metric=metric, value=value, **extra)

    rows = [
        row("a", "heldout", "mode_ok", 1.0),
        row("a", "heldout", "greedy", 0.25),
        row("b", "heldout", "greedy", 0.5, n=40, ci_low=0.35, ci_high=0.65),
        row("a", "train", "greedy", 1.0),
    ]
    lines = evaluation_lines("s", 8, rows, {("a", "heldout"): 4, ("a", "train"): 4})
    assert lines == [
        "eval s@8 heldout (greedy): a 0.250 n=4 · b 0.500 [0.35,0.65] n=40",
        "eval s@8 train (greedy): a 1.000 n=4",
    ]


def test_a_run_with_stderr_redirected_prints_progress_lines(tiny, tmp_path):
    tiny["tracking"]["console"] = True
    tiny["stages"] = [{"name": "a", "steps": 20, "mixture": {"repeat": 1.0}}]
    tiny["eval"]["every"] = 10
    result = run_cli("run", str(write_yaml(tmp_path / "t.yaml", tiny)), "--out", str(tmp_path / "run"))
    assert result.returncode == 0, result.stderr[-3000:]
    progress = re.findall(r"^a: (\d+)/20 steps \(\d+%\), \d+s elapsed, ~\d+s left$", result.stderr, re.M)
    assert progress[-1] == "20" and len(progress) >= 5, result.stderr  # every 10 % of the stage (2 steps)
    evals = re.findall(r"^eval a@(\d+) heldout \(greedy\): (.*)$", result.stderr, re.M)
    assert [step for step, _ in evals] == ["0", "10", "20"]
    assert all(
        re.fullmatch(
            r"repeat [01]\.\d{3} \[[01]\.\d{2},[01]\.\d{2}\] n=4"
            r" · yesno [01]\.\d{3} \[[01]\.\d{2},[01]\.\d{2}\] n=4"
            r" · math [01]\.\d{3} \[[01]\.\d{2},[01]\.\d{2}\] n=4",
            cells,
        )
        for _, cells in evals
    )


def _summary(task: str, run_dir: str) -> dict:
    metrics = {"greedy": 0.125, "mode_ok": 0.5, "tf_first": 0.25, "ft_rank_mean": 3.5, "ft_hijack": 0.0625}
    intervals = {
        m: {"n": 200, "ci_low": 0.0123, "ci_high": 0.9876} for m in ("greedy", "mode_ok", "tf_first", "ft_hijack")
    }

    def stage(name):
        return {
            "name": name,
            "metrics": {"heldout": {task: metrics, "yesno": metrics}},
            "intervals": {"heldout": {task: intervals, "yesno": intervals}},
        }

    event = {
        "metric": "greedy",
        "split": "heldout",
        "step_from": 100,
        "step_to": 150,
        "stage_from": "a_long_stage",
        "stage_to": "a_long_stage",
        "rose": task,
        "rose_by": 0.25,
        "fell": "yesno",
        "fell_by": 0.1875,
        "p_value": 0.0031,
    }
    return {
        "stages": [stage("a_long_stage"), stage("another_long_stage")],
        "seesaw_events": [event],
        "seesaw": {"test": "paired", "tests": 66, "alpha": 0.05},
        "timing": {"total_s": 12.5, "eval_share": 0.2},
        "run_dir": run_dir,
    }


def test_the_final_table_is_printed_whole_when_stderr_is_not_a_terminal(capsys):
    """In a log, rich would lay the table out in 80 (or any fixed number of) columns and cut the cells ("assist…",
    "[0.00,0…"): every cell, event line and the run directory must be there in full."""
    from harness.runs.execution.console import Console

    task = "assistant_qa_with_a_name_long_enough_to_need_a_wide_table"
    run_dir = "/a/run/directory/" + "deep/" * 30 + "run"
    Console(enabled=True).final_report(_summary(task, run_dir), ["heldout"])
    err = capsys.readouterr().err
    assert "…" not in err, err
    rows = [line for line in err.splitlines() if task in line]
    assert len(rows) == 2, err  # the table's row and the event's line, each whole on one line
    table_row = next(line for line in rows if "a_long_stage" in line and "↑" not in line)
    assert table_row.count("[0.01,0.99]") == 4 and "3.500" in table_row, table_row
    assert re.search(
        rf"^greedy/heldout +step 100→150 \(a_long_stage\) +{task} ↑0\.250 +yesno ↓0\.188 +p=0\.0031$", err, re.M
    ), err
    assert f"→ {run_dir}\n" in err
