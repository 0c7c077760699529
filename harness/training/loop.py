"""The training loop: one stage of completion-only SFT, read top to bottom.

Per step: a length-grouped batch → forward through the model body → vocabulary projection *only at supervised
positions* (a completion-only loss never needs the others) → loss → backward → clip → AdamW step, unless the
non-finite guard's flag is up → warmup/cosine schedule. In one process the flag is decided on the device and read
by the host once the next step's forward is queued (or at a log, evaluation or checkpoint step, which read the
device anyway; :mod:`harness.training.guard`): a finite step never waits for its own result.

Every ``log_every`` steps the window's training metrics go to the tracker (overall and per-task loss, lr, grad
norm, update ratio, tokens/s, pad fraction, per-module-group health, the last measured only at log steps); every
``eval.every`` global steps and at the stage's end the ``evaluate`` callback runs; every ``checkpoint_every`` steps a
resumable checkpoint is written. Metrics are accumulated on-device (:class:`~harness.training.window.Window`) and
read back once per window.

An adaptive stage (:mod:`harness.data.steering`) hands the loop a stream instead of a list: each step's global
batch is drawn when the step begins, from the weights of the controller's last update, which
:class:`harness.training.steering.Steering` makes from the per-task losses all-reduced over ranks.

With several ranks (:mod:`harness.training.parallel.ddp`) the loop calls four hooks of ``DataParallel``: each rank
takes its slice of every global batch, the forward goes through DDP, the loss is normalised by the global
supervised-token count, and the window sums and the non-finite flag are all-reduced. Under ``train.parallel: fsdp``
(:mod:`harness.training.parallel.fsdp`) the optimiser trains a sharded replica of the model (``trained``), whose
weights ``sync`` copies into ``model`` before every evaluation and checkpoint.
"""

from __future__ import annotations

import math
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from harness.config import LossSpec, OptimSpec, TrainSpec
from harness.core.store import Row
from harness.data.batches import Batch
from harness.training import parallel as distributed
from harness.training.adapters import param_groups, unwrap
from harness.training.batch_source import StaticBatches, batch_source
from harness.training.chunked_loss import AUTO, Chunking, chunked_head_loss, head_rows
from harness.training.compiling import compile_decision, compiled_stage
from harness.training.forward import output_head, supervised_hidden
from harness.training.guard import (
    Injector,
    NoFaults,
    NonFiniteError,
    StepGuard,
    Verdict,
    first_nonfinite_module,
    nonfinite_grads,
)
from harness.training.health import GroupStats, Unmeasured, gathered
from harness.training.losses import first_answer_tokens, token_losses_and_ce, token_weights
from harness.training.parallel import SingleProcess
from harness.training.special_tokens import check_special_token_gradients
from harness.training.window import Window

ONE_PROCESS = SingleProcess()


def batch_loss(
    model,
    batch: Batch,
    spec: LossSpec,
    task_ids: torch.Tensor,
    tasks: list[str],
    precision: str = "fp32",
    compiled: bool | str = False,
    parallel: distributed.DataParallel | SingleProcess = ONE_PROCESS,
    chunking: Chunking = AUTO,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(loss to back-propagate, plain CE per supervised token, task index per supervised token)``.

    The loss is the stage's (CE or GEM, with per-task and first-token weights); CE is returned as well so every
    run logs the same comparable number whatever it trains on. With several ranks (``parallel``: the loop's hooks,
    ``batch`` this rank's slice of a global batch) the forward runs through DDP and the loss is this rank's term of
    the global mean. ``chunking`` (``train.loss_chunking``): in one process, the loss a chunk of supervised rows at
    a time (:mod:`harness.training.chunked_loss`) when it decides so.
    """
    supervised = batch.supervised  # flat positions, found once at collation
    targets = batch.labels.flatten()[supervised]
    example_of_token = batch.example_of_token  # the example (index into batch.tasks) of each supervised token
    task_of_token = task_ids[example_of_token]
    # Each example's labels end with IGNORE_INDEX, so in a packed row too an answer's first token follows a
    # position without a label.
    first = first_answer_tokens(batch.labels).flatten()[supervised] if spec.first_token_weight != 1.0 else None
    by_example = example_of_token if spec.reduction == "example" else None
    n_examples = len(batch.tasks)
    inputs = (batch.input_ids, batch.attention_mask, supervised, compiled, batch.position_ids, batch.segments)
    autocast = torch.autocast(batch.input_ids.device.type, dtype=torch.bfloat16, enabled=precision == "bf16-autocast")
    one_process = isinstance(parallel, SingleProcess) and chunking.mode is not False
    head = output_head(unwrap(model)) if one_process else None
    rows = chunking.chunk_rows(supervised.numel(), head_rows(head)) if head is not None else None
    if rows is not None:
        weights = token_weights(task_of_token, first, spec, tasks, by_example, n_examples)
        with autocast:
            hidden = supervised_hidden(unwrap(model), *inputs, batch.extra_inputs())
            loss, _, ce = chunked_head_loss(hidden, head, targets, weights, spec, rows)
        return loss, ce, task_of_token
    with autocast:
        logits = parallel.logits_module(model)(*inputs, batch.extra_inputs())
    losses, ce = token_losses_and_ce(logits, targets, spec)
    loss = parallel.loss_mean(losses, task_of_token, first, spec, tasks, by_example, n_examples)
    return loss, ce, task_of_token


def make_optimizer(model, spec: OptimSpec, total_steps: int):
    """AdamW with linear warmup, then cosine / linear / constant. No weight decay on biases, norms and row-masked
    matrices (:func:`harness.training.adapters.param_groups`: decay would move the rows ``new_token_rows`` freezes)."""
    groups = param_groups(model, spec.weight_decay)
    try:  # one fused kernel per parameter (CPU and CUDA); the foreach path loops over small ops on a CPU
        optimizer = torch.optim.AdamW(groups, lr=spec.lr, betas=spec.betas, eps=spec.eps, fused=True)
    except (RuntimeError, ValueError):  # a device or dtype the fused kernel does not support
        optimizer = torch.optim.AdamW(groups, lr=spec.lr, betas=spec.betas, eps=spec.eps, foreach=True)

    def factor(step: int) -> float:
        if step < spec.warmup:
            return (step + 1) / spec.warmup
        if spec.schedule == "constant":
            return 1.0
        progress = min(1.0, (step - spec.warmup) / max(1, total_steps - spec.warmup))
        shape = 0.5 * (1 + math.cos(math.pi * progress)) if spec.schedule == "cosine" else 1 - progress
        return spec.min_lr_ratio + (1 - spec.min_lr_ratio) * shape

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    return optimizer, scheduler


@dataclass
class LoopState:
    """Where a stage's loop is: enough to continue it exactly (saved in resumable checkpoints)."""

    batch_index: int = 0  # batches of this stage already consumed
    consecutive_skips: int = 0
    window: dict[str, Any] | None = None
    optimizer: dict[str, Any] | None = None
    scheduler: dict[str, Any] | None = None
    mixture: dict[str, Any] | None = None  # an adaptive stage's stream (the same on every rank)
    steer: dict[str, Any] | None = None  # its per-task loss sums since the last update (this rank's own)
    # packed or padded, as decided when the stage began (harness.runs.execution.packing_decision.decision): a resume
    # trains
    # the same batches
    packing: dict[str, Any] | None = None


@dataclass(init=False)
class StageLoop:
    """The settings of one stage's loop and the callbacks it reports through.

    ``train`` is the stage's :class:`~harness.config.TrainSpec`; the loop reads ``optim``, ``loss``, ``precision``,
    ``log_every``, ``nonfinite``, ``diagnostics``, ``compile`` (not while a fault is injected) and
    ``checkpoint_every`` from it. Loops that are not an experiment's stage (pretraining, the sanity check, tests)
    give those settings as keywords instead, over the defaults (``compile`` false there): ``StageLoop(...,
    optim=OptimSpec(lr=1e-3), log_every=5)``.
    """

    stage: str
    start_step: int  # global step before the stage's first batch
    tasks: list[str]
    log: Callable[[list[Row], int], None]
    evaluate: Callable[[int], None]
    train: TrainSpec
    eval_every: int
    special_tokens: dict[str, int]  # must get gradient at the stage's first step
    injector: Injector | NoFaults
    save_checkpoint: Callable[[int, LoopState], None]
    progress: Callable[[int], None]
    kill_at: int | None  # debug.kill_rank: the global step at which this process SIGKILLs itself
    measure_steering: Callable[[], dict[str, tuple[float, int, float, float]]] | None  # steering_error's signal

    def __init__(
        self,
        stage: str,
        start_step: int,
        tasks: list[str],
        log: Callable[[list[Row], int], None],
        evaluate: Callable[[int], None],
        train: TrainSpec | None = None,
        *,
        eval_every: int = 10**9,
        special_tokens: dict[str, int] | None = None,
        injector: Injector | None = None,
        save_checkpoint: Callable[[int, LoopState], None] | None = None,
        progress: Callable[[int], None] | None = None,
        kill_at: int | None = None,
        measure_steering: Callable[[], dict[str, tuple[float, int, float, float]]] | None = None,
        **train_settings: Any,
    ):
        unknown = sorted(set(train_settings) - set(TrainSpec.model_fields))
        if unknown:
            raise TypeError(f"StageLoop: unknown train setting(s) {', '.join(unknown)}")
        self.stage, self.start_step, self.tasks, self.log, self.evaluate = stage, start_step, tasks, log, evaluate
        # Loops that are not a stage stay eager unless told: pretraining's numbers are cached by a key without it.
        base = train if train is not None else TrainSpec(compile=False)
        if save_checkpoint is None:  # nothing would write a resume point: the loop makes none
            train_settings["checkpoint_every"] = None
        self.train = base.model_copy(update=train_settings)
        self.eval_every, self.special_tokens = eval_every, special_tokens or {}
        self.injector = injector if injector is not None else NoFaults()
        self.save_checkpoint = save_checkpoint if save_checkpoint is not None else _no_resume_point
        self.progress = progress if progress is not None else _no_progress
        self.kill_at = kill_at
        # the signal steering_error's measurement on the stage's steering split, in the runs layer (which may read
        # the evaluators): {task: (error, n, ci_low, ci_high)}; every rank calls it together
        self.measure_steering = measure_steering


def _no_resume_point(step: int, state: LoopState) -> None:
    pass


def _no_progress(steps: int) -> None:
    pass


def _diagnose(
    model, batch: Batch, loop: StageLoop, task_ids: torch.Tensor, step: int, what: str, parallel
) -> dict[str, Any]:
    """Name the first module with a non-finite output (re-running the batch with hooks, and with the step's injected
    fault, if any) and the bad grads. A sharded (FSDP) model re-runs through its sharded forward, on every rank (the
    all-gathers must match); a DDP model re-runs outside DDP (a second DDP forward before the optimiser step would
    confuse its reducer)."""
    through = parallel if parallel.sharded else ONE_PROCESS
    tasks: dict[str, int] = {}
    for t in batch.tasks:
        tasks[t] = tasks.get(t, 0) + 1
    loop.injector.before_forward(model, step)
    try:
        first = first_nonfinite_module(
            model,
            lambda: batch_loss(
                model,
                batch,
                loop.train.loss,
                task_ids,
                loop.tasks,
                loop.train.precision,
                parallel=through,
                chunking=Chunking.of(loop.train),
            ),
        )
    finally:
        loop.injector.remove()
    return {
        "step": step,
        "stage": loop.stage,
        "what": what,
        "first_module": first,
        "nonfinite_grads": nonfinite_grads(model),
        "tasks": tasks,
    }


@dataclass
class Trained:
    """A step whose update the device has (or, when flagged, has not) applied, kept until the host reads its
    verdict: what its metrics need, and its gradients for the guard's report."""

    step: int
    batch: Batch
    task_ids: torch.Tensor
    ce: torch.Tensor
    task_of_token: torch.Tensor
    grad_norm: torch.Tensor
    share: float
    verdict: Verdict
    grads: list[torch.Tensor | None]


def _settle(
    done: Trained, loop: StageLoop, state: LoopState, window: Window, source, trained, params, parallel
) -> bool:
    """Read ``done``'s verdict and act on it: a finite step's metrics join the window and the steering; a non-finite
    step stops the stage or is counted as skipped. True when it was skipped."""
    # the step's gradients leave ``done`` now: a finite step's are freed here, not held through the next backward
    grads, done.grads = done.grads, []
    loss_bad, grad_bad, bad_ranks = done.verdict.read()
    if not (loss_bad or grad_bad or bad_ranks):
        state.consecutive_skips = 0
        window.add(done.ce, done.task_of_token, done.grad_norm, done.batch, done.share)
        source.trained(done.ce, done.task_of_token)
        return False
    saved = [p.grad for p in params]
    for p, g in zip(params, grads):  # the flagged step's gradients, which its update never used
        p.grad = g
    try:
        what = "loss" if loss_bad else "gradient"
        report = _diagnose(trained, done.batch, loop, done.task_ids, done.step, what, parallel)
    finally:
        for p, g in zip(params, saved):
            p.grad = g
    # with several ranks, the report of the first rank where it began, on every rank, so that all of them stop here
    report = parallel.report_of(bad_ranks[0], report) if bad_ranks else report
    _skip_or_stop(report, state, loop, window, done.step)
    return True


def _window_rows(
    loop: StageLoop,
    step: int,
    window: Window,
    lr: float,
    groups: GroupStats | Unmeasured,
    before: dict | None,
    group_grads: dict[str, float] | None,
) -> list[Row]:
    """The window's training metrics, with the per-module-group update ratios and grad norms when measured."""
    out = window.rows(loop.tasks, loop.stage, step, lr)
    if before is not None:  # measured (train.diagnostics) at this log step
        ratios = groups.update_ratios(before)
        out.append(Row(loop.stage, step, None, "train", "update_ratio", ratios.pop("all")))
        out += [Row(loop.stage, step, None, "train", f"diag/{g}/update_ratio", v) for g, v in ratios.items()]
        out += [Row(loop.stage, step, None, "train", f"diag/{g}/grad_norm", v) for g, v in (group_grads or {}).items()]
    return out


def train_stage(model, batches, loop: StageLoop, resume: LoopState | None = None) -> int:
    """Train ``model`` on ``batches`` (one optimiser step each), from ``resume`` if given; returns the global
    step at the end. ``batches`` is a list, or an adaptive mixture's stream
    (:class:`harness.data.steering.stream.AdaptiveStream`), which draws each step's batch as the stage trains.
    Raises :class:`~harness.training.guard.NonFiniteError` when the guard stops the run, and
    :class:`~harness.training.compiling.CompileFailed` when ``train.compile: true`` cannot compile."""
    device = next(model.parameters()).device
    # Decided from the stage's length (not what is left of it: a resumed stage decides as its first run did).
    # Injected faults are forward hooks: they need eager modules.
    compile_it = compile_decision(loop.train.compile, len(batches), device.type) and not loop.injector.needs_eager
    with compiled_stage(compile_it):
        return _train_stage(model, batches, loop, resume, loop.train.compile if compile_it else False)


def _optimizer_for(trained, spec: OptimSpec, steps: int, state: LoopState, parallel):
    """The stage's optimiser and schedule, continuing a resumed stage's saved state."""
    optimizer, scheduler = make_optimizer(trained, spec, steps)
    if state.optimizer is not None:  # FSDP shards the saved (one-process format) state onto its ranks
        parallel.load_optimizer_state(optimizer, state.optimizer)
        scheduler.load_state_dict(state.scheduler)
    return optimizer, scheduler


def _skip_or_stop(report: dict[str, Any], state: LoopState, loop: StageLoop, window: Window, step: int) -> None:
    """A non-finite step: stop (``nonfinite.action: stop``, or too many skips in a row), or count the dropped step
    (``skip_step``; its update was never applied, and the schedule moved on)."""
    nonfinite = loop.train.nonfinite
    state.consecutive_skips += 1
    if nonfinite.action == "stop" or state.consecutive_skips >= nonfinite.max_consecutive:
        if nonfinite.action == "skip_step":
            report["consecutive_skips"] = state.consecutive_skips
        raise NonFiniteError(report)
    window.skipped += 1
    loop.log([Row(loop.stage, step, None, "train", "nonfinite_skip", 1.0)], step)


def _train_stage(model, batches, loop: StageLoop, resume: LoopState | None, compiled: bool | str) -> int:
    train, task_index = loop.train, {t: i for i, t in enumerate(loop.tasks)}
    parallel = distributed.loop_hooks(train.parallel)  # SingleProcess in one process
    state = resume or LoopState()
    device = next(model.parameters()).device
    source = batch_source(batches, loop, parallel, state, model)
    if started_rows := source.start_rows(state.batch_index, loop.start_step):  # an adaptive stage's start weights
        loop.log(started_rows, loop.start_step)
    # What the optimiser trains: ``model`` itself, or under FSDP a sharded replica whose weights are synced back
    # into ``model`` before every evaluation and checkpoint (harness.training.parallel.fsdp).
    trained = parallel.trained_module(model, train.precision)
    params = [p for p in trained.parameters() if p.requires_grad]
    groups = GroupStats(trained) if train.diagnostics else Unmeasured()
    optimizer, scheduler = _optimizer_for(trained, train.optim, len(source), state, parallel)
    window = Window.from_state(len(loop.tasks), state.window) if state.window else Window(len(loop.tasks))
    max_norm = train.optim.grad_clip if train.optim.grad_clip is not None else float("inf")
    # An adaptive stage's controller hears each step's losses before its next draw: its verdicts are read at once.
    guard = StepGuard(train.nonfinite.action, parallel, optimizer, may_defer=isinstance(source, StaticBatches))
    pending: Trained | None = None  # a step whose device-side verdict the host has not read yet
    trained.train()
    source.begin(state.batch_index, device)

    for i in range(state.batch_index, len(source)):
        batch, step = source.batch(i), loop.start_step + i + 1  # an adaptive stage draws it now
        task_ids = torch.tensor([task_index[t] for t in batch.tasks]).to(device)
        is_log_step = (i + 1) % train.log_every == 0 or i + 1 == len(source)
        evaluates = step % loop.eval_every == 0 or i + 1 == len(source)
        checkpoints = bool(train.checkpoint_every) and step % train.checkpoint_every == 0 and i + 1 < len(source)
        started = time.perf_counter()

        if step == loop.kill_at:  # no cleanup, no exit code: what a crashed or OOM-killed rank leaves behind
            os.kill(os.getpid(), signal.SIGKILL)
        loop.injector.before_forward(trained, step)
        loss, ce, task_of_token = batch_loss(
            trained, batch, train.loss, task_ids, loop.tasks, train.precision, compiled, parallel, Chunking.of(train)
        )
        if pending is not None:  # the last step's verdict, read now that this step's forward is queued behind it
            _settle(pending, loop, state, window, source, trained, params, parallel)
            pending = None
        loss.backward()
        source.after_backward(i)  # on a GPU the next batch's copy overlaps this step's work
        loop.injector.after_backward(trained, step)
        if i == 0 and loop.special_tokens:
            # Before the stage's first update: every special token the stage uses must reach its trainable row.
            check_special_token_gradients(trained, loop.special_tokens, batch=batch)
        group_grads = groups.grad_norms() if is_log_step else None
        grad_norm = gathered(torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None]))
        before = groups.snapshot() if is_log_step else None
        verdict = guard.step(optimizer, loss, grad_norm, params, max_norm)  # clip, then AdamW unless non-finite
        scheduler.step()  # a skipped step keeps the schedule
        done = Trained(
            step, batch, task_ids, ce, task_of_token, grad_norm, source.share(i), verdict, [p.grad for p in params]
        )
        optimizer.zero_grad(set_to_none=True)  # the gradients live on in ``done`` until its verdict is read
        loop.injector.remove()
        if guard.defers and not (is_log_step or evaluates or checkpoints):
            pending = done
        elif _settle(done, loop, state, window, source, trained, params, parallel):
            before = None  # a skipped step has no update to measure

        window.seconds += time.perf_counter() - started
        if is_log_step:
            parallel.sum_window(window)
            loop.log(_window_rows(loop, step, window, scheduler.get_last_lr()[0], groups, before, group_grads), step)
            window = Window(len(loop.tasks))
        if steered := source.after_step(i, step):  # an adaptive stage's controller updated its weights
            loop.log(steered, step)
        loop.progress(1)
        if evaluates:
            parallel.sync(model)
            loop.evaluate(step)
            trained.train()
        if checkpoints:
            at = LoopState(i + 1, state.consecutive_skips, window.state(), packing=state.packing)
            _checkpoint(model, loop, step, at, optimizer, scheduler, parallel, source)
    return loop.start_step + len(source)


def _checkpoint(model, loop: StageLoop, step: int, at: LoopState, optimizer, scheduler, parallel, source) -> None:
    """A resume point after ``step``: the loop's position ``at``, the optimiser and schedule, an adaptive stage's
    stream and partial sums."""
    parallel.sync(model)
    at.optimizer = parallel.optimizer_state(optimizer)
    at.scheduler = scheduler.state_dict()
    at.mixture, at.steer = source.resume_state()
    loop.save_checkpoint(step, at)
