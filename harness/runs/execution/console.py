"""What people see: progress bars per stage, a few status lines, one line per split after each evaluation (each
task's main score with its 95 % interval and n; a line for the yes/no ranking and one for benchmarks), and the
final table (scores with intervals) with seesaw events. (The console is for people; the store is for programs.)

When stderr is not a terminal (a batch job, a CI log, ``nohup``), rich draws no live bar, so progress is printed as
plain lines instead — every :data:`PLAIN_EVERY_FRACTION` of a stage or :data:`PLAIN_EVERY_S` seconds, whichever
comes first, as tqdm and the HF Trainer do in cluster logs — and the final table is laid out at its own full width
and the event lines are never wrapped (rich would otherwise cut both at its default 80 columns: "assist…").
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console as RichConsole
from rich.measure import Measurement
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from harness.core.metrics import BENCH_TASK_PREFIX, is_benchmark_task
from harness.core.seesaw_families import describe_counts, families_scope
from harness.evaluation.evidence import format_score
from harness.evaluation.forgetting import REF_SPLIT

TABLE_METRICS = ("greedy", "mode_ok", "tf_first", "ft_rank_mean", "ft_hijack")
MAIN_SCORES = ("greedy", "tf_exact", "tf_first", "mode_ok")  # the evaluation line shows the first one measured
PLAIN_EVERY_FRACTION = 0.1
PLAIN_EVERY_S = 30.0


class PlainProgress:
    """``advance(n)`` printing ``name: done/total steps (pct%), elapsed, ~left`` lines through ``write``."""

    def __init__(
        self,
        name: str,
        total: int,
        write: Callable[[str], None],
        every_fraction: float = PLAIN_EVERY_FRACTION,
        every_s: float = PLAIN_EVERY_S,
    ):
        self.name, self.total, self.write = name, total, write
        self.every_steps = max(1, int(total * every_fraction))
        self.every_s = every_s
        self.done, self.printed_at = 0, 0
        self.started = self.last_time = time.monotonic()

    def __call__(self, n: int = 1) -> None:
        if n <= 0:
            return
        self.done += n
        now = time.monotonic()
        if (
            self.done - self.printed_at < self.every_steps
            and now - self.last_time < self.every_s
            and self.done < self.total
        ):
            return
        elapsed = now - self.started
        left = elapsed / self.done * (self.total - self.done)
        self.write(
            f"{self.name}: {self.done}/{self.total} steps ({100 * self.done / max(self.total, 1):.0f}%), "
            f"{elapsed:.0f}s elapsed, ~{left:.0f}s left"
        )
        self.printed_at, self.last_time = self.done, now


def evaluation_lines(stage: str, step: int, rows: Iterable[Any], n_items: dict[tuple[str, str], int]) -> list[str]:
    """One line per split: each task's main score (:data:`MAIN_SCORES`) with its item count, and its interval when
    the row carries one (``ci_low`` / ``ci_high``)."""
    scores: dict[str, dict[str, Any]] = {}
    for row in rows:
        if row.task is None or row.metric not in MAIN_SCORES:
            continue
        current = scores.setdefault(row.split, {}).get(row.task)
        if current is None or MAIN_SCORES.index(row.metric) < MAIN_SCORES.index(current.metric):
            scores[row.split][row.task] = row
    lines = []
    for split, tasks in scores.items():
        cells = []
        for task, row in tasks.items():
            n = getattr(row, "n", None) or n_items.get((task, split))
            low, high = getattr(row, "ci_low", None), getattr(row, "ci_high", None)
            cells.append(f"{task} {format_score(row.value, low, high, n)}")
        metric = next(iter(tasks.values())).metric
        lines.append(f"eval {stage}@{step} {split} ({metric}): " + " · ".join(cells))
    return lines + choice_lines(stage, step, rows) + benchmark_lines(stage, step, rows)


def _score(row: Any) -> str:
    return format_score(row.value, getattr(row, "ci_low", None), getattr(row, "ci_high", None), getattr(row, "n", None))


def choice_lines(stage: str, step: int, rows: Iterable[Any]) -> list[str]:
    """One line per split with two-answer tasks: each one's ``choice_auc`` with its interval, n and p-value, and
    the share of items where "Yes" is the likelier answer (``choice_yes``) — the ranking greedy hides."""
    found: dict[str, dict[str, dict[str, Any]]] = {}
    for row in rows:
        if row.task is not None and row.metric in ("choice_auc", "choice_auc_p", "choice_yes"):
            found.setdefault(row.split, {}).setdefault(row.task, {})[row.metric] = row
    lines = []
    for split, tasks in found.items():
        cells = [
            f"{task} {_score(m['choice_auc'])} p={m['choice_auc_p'].value:.2g}, yes {_score(m['choice_yes'])}"
            for task, m in tasks.items()
            if {"choice_auc", "choice_auc_p", "choice_yes"} <= m.keys()
        ]
        if cells:
            lines.append(f"choice {stage}@{step} {split} (auc of P(yes), yes share): " + " · ".join(cells))
    return lines


def benchmark_lines(stage: str, step: int, rows: Iterable[Any]) -> list[str]:
    """One line with every benchmark metric of the evaluation (``eval.benchmarks``), intervals and n."""
    cells = [
        f"{row.task[len(BENCH_TASK_PREFIX) :]} {row.metric} {_score(row)}"
        for row in rows
        if is_benchmark_task(row.task)
    ]
    return [f"bench {stage}@{step}: " + " · ".join(cells)] if cells else []


class Console:
    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self.rich = RichConsole(stderr=True, highlight=False)

    def info(self, message: str) -> None:
        if self.enabled:
            self.rich.print(message, markup=False, soft_wrap=True)

    def evaluation_hook(
        self, items: Iterable[Any], then: Callable[[str, int, list], None] | None = None
    ) -> Callable[[str, int, list], None]:
        """An ``on_evaluation(stage, step, rows)`` callback that prints :func:`evaluation_lines` (item counts from
        the eval ``items``), then calls ``then``."""
        n_items = Counter((item.task, item.split) for item in items)

        def announce(stage: str, step: int, rows: list) -> None:
            for line in evaluation_lines(stage, step, rows, n_items):
                self.info(line)
            if then is not None:
                then(stage, step, rows)

        return announce

    @contextmanager
    def stage_progress(self, name: str, total: int) -> Iterator[Callable[[int], None]]:
        """A progress bar for one stage (or pretraining); yields ``advance(n)``."""
        if not self.enabled:
            yield lambda n=1: None
            return
        if not self.rich.is_terminal:
            yield PlainProgress(name, total, self.info)
            return
        with Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=self.rich,
            transient=False,
        ) as bar:
            task = bar.add_task(name, total=total)
            yield lambda n=1: bar.advance(task, n)

    def progress_factory(self) -> Callable[[str, int], Callable[[int], None]] | None:
        """For code that runs a bar without a ``with`` block (pretraining): returns ``advance`` callbacks."""
        if not self.enabled:
            return None
        if not self.rich.is_terminal:
            return lambda name, total: PlainProgress(name, total, self.info)
        console = self

        def make(name: str, total: int) -> Callable[[int], None]:
            bar = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=console.rich,
            )
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
            table.add_column("n", justify="right")
            for metric in TABLE_METRICS:
                table.add_column(metric, justify="right")
            tasks = sorted({t for st in summary["stages"] for t in st["metrics"].get(split, {})})
            for task in tasks:
                for i, st in enumerate(summary["stages"]):
                    values = st["metrics"].get(split, {}).get(task, {})
                    cis = st.get("intervals", {}).get(split, {}).get(task, {})
                    n = next((c["n"] for c in cis.values()), None)
                    cells = [
                        format_score(values.get(m), cis.get(m, {}).get("ci_low"), cis.get(m, {}).get("ci_high"))
                        for m in TABLE_METRICS
                    ]
                    table.add_row(task if i == 0 else "", st["name"], "-" if n is None else str(n), *cells)
            self._print_table(table)
        self._reference_table(summary)
        events = summary.get("seesaw_events", [])
        if events:
            from harness.core.seesaw import format_events

            self.rich.print(f"[bold]{_seesaw_header(summary)}[/]:", soft_wrap=True)
            self.rich.print(format_events(events), markup=False, soft_wrap=True)
        else:
            self.rich.print(_seesaw_header(summary), markup=False, soft_wrap=True)
        timing = summary["timing"]
        self.rich.print(
            f"done in {timing['total_s']:.1f}s (evaluation {100 * timing['eval_share']:.0f}%) → {summary['run_dir']}",
            markup=False,
            soft_wrap=True,
        )

    def _reference_table(self, summary: dict[str, Any]) -> None:
        """The forgetting probe's rows at each stage's end (split ``ref``), when it ran: the current and the base
        model's loss on the reference text, their paired difference and the perplexity, each with its interval."""
        metrics = ("ref_loss", "ref_loss_base", "ref_loss_delta", "ref_ppl")
        tasks = sorted({t for st in summary["stages"] for t in st["metrics"].get(REF_SPLIT, {})})
        if not tasks:
            return
        table = Table(title="reference text: loss (nats/token), base model, difference, perplexity", show_lines=False)
        for column in ("task", "stage", "n", *metrics):
            table.add_column(column, justify="left" if column in ("task", "stage") else "right")
        for task in tasks:
            for i, st in enumerate(summary["stages"]):
                values = st["metrics"].get(REF_SPLIT, {}).get(task, {})
                cis = st.get("intervals", {}).get(REF_SPLIT, {}).get(task, {})
                n = next((c["n"] for c in cis.values()), None)
                cells = [format_score(values.get(m), cis.get(m, {}).get("ci_low"), cis.get(m, {}).get("ci_high"))
                         for m in metrics]  # fmt: skip
                table.add_row(task if i == 0 else "", st["name"], "-" if n is None else str(n), *cells)
        self._print_table(table)

    def _print_table(self, table: Table) -> None:
        """A table as wide as the terminal allows; in a log (stderr not a terminal) at its natural width, however
        wide: rich lays a table out within the console's width (80 columns when it cannot ask a terminal), and a
        ``width=`` argument to ``print`` cannot exceed it, so a wide one goes through a console of its own width."""
        if self.rich.is_terminal:
            self.rich.print(table)
            return
        natural = Measurement.get(self.rich, self.rich.options.update_width(1 << 16), table).maximum
        wide = RichConsole(
            file=self.rich.file,
            width=max(natural, self.rich.width),
            highlight=False,
            color_system=None,
            force_terminal=False,
        )
        wide.print(table)


def _seesaw_header(summary: dict[str, Any]) -> str:
    """``seesaw events: 6 task–reference text (families: task–task, and …; 66 paired tests, BH α=0.05)`` — the
    events per family and the families the run's rule covers, as the report's findings say them
    (:mod:`harness.core.seesaw_families`)."""
    events = summary.get("seesaw_events", [])
    head = f"seesaw events: {describe_counts(events)}" if events else "no seesaw events"
    if not summary.get("seesaw"):  # nothing was tested (harness eval: one evaluation)
        return head
    return f"{head} ({families_scope(summary['seesaw']['test'])}; {_rule(summary)})"


def _rule(summary: dict[str, Any]) -> str:
    """``66 paired tests, BH α=0.05`` / ``untested threshold rule`` — how the run's seesaw events were decided."""
    rule = summary.get("seesaw")
    if not rule:
        return ""
    if rule["test"] == "none":
        return "untested threshold rule"
    return f"{rule['tests']} paired tests, BH α={rule['alpha']:g}"
