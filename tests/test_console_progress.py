"""What a person watching sees when stderr is a file: plain progress lines and one line per split per evaluation."""

from __future__ import annotations

import re
from types import SimpleNamespace

from harness.runs.console import PlainProgress, evaluation_lines
from tests.conftest import run_cli, write_yaml


def test_plain_progress_prints_every_tenth_and_at_the_end():
    lines: list[str] = []
    advance = PlainProgress("stage", 25, lines.append, every_s=1e9)
    for _ in range(25):
        advance(1)
    assert [re.match(r"stage: (\d+)/25 steps", line).group(1) for line in lines] == [
        "2", "4", "6", "8", "10", "12", "14", "16", "18", "20", "22", "24", "25"]


def test_evaluation_lines_show_the_main_score_n_and_an_interval_when_given():
    row = lambda task, split, metric, value, **extra: SimpleNamespace(task=task, split=split, metric=metric,  # noqa: E731
                                                                       value=value, **extra)
    rows = [row("a", "heldout", "mode_ok", 1.0), row("a", "heldout", "greedy", 0.25),
            row("b", "heldout", "greedy", 0.5, n=40, ci_low=0.35, ci_high=0.65), row("a", "train", "greedy", 1.0)]
    lines = evaluation_lines("s", 8, rows, {("a", "heldout"): 4, ("a", "train"): 4})
    assert lines == ["eval s@8 heldout (greedy): a 0.250 n=4 · b 0.500 [0.35,0.65] n=40",
                     "eval s@8 train (greedy): a 1.000 n=4"]


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
    assert all(re.fullmatch(r"repeat [01]\.\d{3} \[[01]\.\d{2},[01]\.\d{2}\] n=4 · yesno [01]\.\d{3} \[[01]\.\d{2},[01]\.\d{2}\] n=4 · math [01]\.\d{3} \[[01]\.\d{2},[01]\.\d{2}\] n=4", cells)
               for _, cells in evals)
