"""What people see: progress bars per stage, a few status lines, and the final table with seesaw events.
(The console is for people; the store is for programs.)"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Iterator

from rich.console import Console as RichConsole
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

TABLE_METRICS = ("greedy", "mode_ok", "tf_first", "ft_rank_mean", "ft_hijack")


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

    def final_report(self, summary: dict[str, Any], splits: list[str]) -> None:
        if not self.enabled:
            return
        for split in splits:
            table = Table(title=f"stage-end metrics ({split})", show_lines=False)
            table.add_column("task")
            table.add_column("stage")
            for metric in TABLE_METRICS:
                table.add_column(metric, justify="right")
            tasks = sorted({t for st in summary["stages"] for t in st["metrics"].get(split, {})})
            for task in tasks:
                for i, st in enumerate(summary["stages"]):
                    values = st["metrics"].get(split, {}).get(task, {})
                    cells = [f"{values[m]:.3f}" if m in values else "-" for m in TABLE_METRICS]
                    table.add_row(task if i == 0 else "", st["name"], *cells)
            self.rich.print(table)
        events = summary.get("seesaw_events", [])
        if events:
            from harness.evaluation.seesaw import format_events

            self.rich.print(f"[bold]seesaw events[/] ({len(events)}):")
            self.rich.print(format_events(events), markup=False)
        else:
            self.rich.print("no seesaw events")
        timing = summary["timing"]
        self.rich.print(f"done in {timing['total_s']:.1f}s (evaluation {100 * timing['eval_share']:.0f}%) → "
                        f"{summary['run_dir']}")
