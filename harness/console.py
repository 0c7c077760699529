"""What people see: progress bars per stage, a few status lines, one line per split after each evaluation (each
task's main score with its 95 % interval), and the final table (scores with intervals) with seesaw events.
(The console is for people; the store is for programs.)"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Iterator

from rich.console import Console as RichConsole
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from harness.evaluation.evidence import format_score

TABLE_METRICS = ("greedy", "mode_ok", "tf_first", "ft_rank_mean", "ft_hijack")
TABLE_WIDTH = 140
MAIN_METRICS = ("greedy", "tf_first", "ft_hijack")  # an evaluation line shows the first of these that was measured


class Console:
    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self.rich = RichConsole(stderr=True, highlight=False)

    def info(self, message: str) -> None:
        if self.enabled:
            self.rich.print(message, markup=False)

    @contextmanager
    def stage_progress(self, name: str, total: int) -> Iterator[Callable[[int], None]]:
        """A progress bar for one stage (or pretraining); yields ``advance(n)``."""
        if not self.enabled:
            yield lambda n=1: None
            return
        with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), TimeRemainingColumn(), console=self.rich, transient=False) as bar:
            task = bar.add_task(name, total=total)
            yield lambda n=1: bar.advance(task, n)

    def progress_factory(self) -> Callable[[str, int], Callable[[int], None]] | None:
        """For code that runs a bar without a ``with`` block (pretraining): returns ``advance`` callbacks."""
        if not self.enabled:
            return None
        console = self

        def make(name: str, total: int) -> Callable[[int], None]:
            bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                           TimeElapsedColumn(), console=console.rich)
            task = bar.add_task(name, total=total)
            bar.start()

            def advance(n: int = 1) -> None:
                bar.advance(task, n)
                if bar.finished:
                    bar.stop()

            return advance

        return make

    def evaluation_lines(self, stage: str, step: int, rows: list) -> None:
        """After an evaluation: per split, ``eval step 50 (mix) heldout greedy: yesno 0.458 [0.28,0.65] n=24 ·
        …`` (store rows in; the first of :data:`MAIN_METRICS` measured)."""
        if not self.enabled:
            return
        measured = {r.metric for r in rows}
        metric = next((m for m in MAIN_METRICS if m in measured), None)
        if metric is None:
            return
        by_split: dict[str, list] = {}
        for r in rows:
            if r.metric == metric and r.task is not None:
                by_split.setdefault(r.split, []).append(r)
        for split, found in by_split.items():
            cells = " · ".join(f"{r.task} {format_score(r.value, r.ci_low, r.ci_high, r.n)}" for r in found)
            self.info(f"eval step {step} ({stage}) {split} {metric}: {cells}")

    def final_report(self, summary: dict[str, Any], splits: list[str]) -> None:
        if not self.enabled:
            return
        for split in splits:
            table = Table(title=f"stage-end metrics ({split})", show_lines=False)
            table.add_column("task")
            table.add_column("stage")
            table.add_column("n", justify="right")
            for metric in TABLE_METRICS:
                table.add_column(metric, justify="right")
            tasks = sorted({t for st in summary["stages"] for t in st["metrics"].get(split, {})})
            for task in tasks:
                for i, st in enumerate(summary["stages"]):
                    values = st["metrics"].get(split, {}).get(task, {})
                    cis = st.get("intervals", {}).get(split, {}).get(task, {})
                    n = next((c["n"] for c in cis.values()), None)
                    cells = [format_score(values.get(m), cis.get(m, {}).get("ci_low"), cis.get(m, {}).get("ci_high"))
                             for m in TABLE_METRICS]
                    table.add_row(task if i == 0 else "", st["name"], "-" if n is None else str(n), *cells)
            # a log file (stderr not a terminal) would cut the interval columns at rich's default 80 characters
            self.rich.print(table, width=None if self.rich.is_terminal else max(self.rich.width, TABLE_WIDTH))
        events = summary.get("seesaw_events", [])
        if events:
            from harness.evaluation.seesaw import format_events

            self.rich.print(f"[bold]seesaw events[/] ({len(events)}{_rule(summary)}):")
            self.rich.print(format_events(events), markup=False)
        else:
            self.rich.print(f"no seesaw events{_rule(summary)}", markup=False)
        timing = summary["timing"]
        self.rich.print(f"done in {timing['total_s']:.1f}s (evaluation {100 * timing['eval_share']:.0f}%) → "
                        f"{summary['run_dir']}")


def _rule(summary: dict[str, Any]) -> str:
    """``, paired tests: 66, BH α=0.05`` / ``, untested rule`` — how the run's seesaw events were decided."""
    rule = summary.get("seesaw")
    if not rule:
        return ""
    if rule["test"] == "none":
        return ", untested threshold rule"
    return f", {rule['tests']} paired tests, BH α={rule['alpha']:g}"
