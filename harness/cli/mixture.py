"""The ``harness mixture SWEEP_DIR`` command, a plain function :mod:`harness.cli.app` registers: the mixing-law fits
of a finished sweep with their cross-validated errors, the chosen form, and the mixture it proposes inside the
explored convex hull with its predicted value and bootstrap interval, next to the sweep's in-sample winner
(:mod:`analysis.mixture_proposal`); ``proposal.json`` is written in the sweep directory. ``--table FILE`` does the
same from any table of results (:mod:`analysis.mixture_table`), ``--holdout`` tests the law on mixtures it was not
fitted on, ``--predict FILE`` writes its prediction for given mixtures, ``--snr GROUP_DIR`` prints each target's
signal-to-noise ratio and the loss → greedy link's CV (:mod:`analysis.mixture_snr`). ``--verify K`` then trains
the proposal and the winner on K fresh seeds, here or through a launcher, and writes ``verify.json``
(:mod:`harness.studies.mixture_verify`; ``--full-size``: a proxy sweep's arms at full size). ``--set objective.…``
reads the same trials for another objective, everything it writes under ``SWEEP_DIR/objective-<…>/``. Nothing heavy
is imported before the command runs."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from harness.cli.launching import DetachOption, LauncherOption, SlurmOption, choose_launcher, raise_usage

# The options of --table and of the held-out test (module level, as LauncherOption: the signature stays short).
TableOption = typer.Option(
    None,
    "--table",
    help="Fit a table of results instead of a sweep: a .csv or .parquet file, one row per run, a column per "
    "mixture weight (--weights) and per outcome (--objective), optionally a seed column (docs/sweeps.md).",
)
WeightsOption = typer.Option(
    None, "--weights", help="With --table: the weight columns, comma-separated names or patterns (w_*)."
)
ObjectiveOption = typer.Option(
    None,
    "--objective",
    help="With --table: the outcome column to optimise, or mean|min|max(COLUMN, …) of several (names or "
    "patterns); each named column is a target the law is fitted to.",
)
DirectionOption = typer.Option(None, "--direction", help="With --table: maximize or minimize.")
SeedColumnOption = typer.Option(
    None, "--seed-column", help="With --table: the runs' seed column (default: a column named seed, if any)."
)
ProportionOption = typer.Option(
    False, "--proportion", help="With --table: the outcomes are rates in [0, 1] (the log-linear law fits logits)."
)
ToleranceOption = typer.Option(
    1e-3, "--tolerance", min=0.0, help="With --table: how far from 1 a row's weights may sum."
)
HoldoutOption = typer.Option(
    None,
    "--holdout",
    help="Mixtures not fitted on, to test the law on: another sweep directory of the same space (or, with "
    "--table, another table of the same columns). Reports each target's Spearman rho and RMSE there.",
)
HoldoutColumnOption = typer.Option(
    None, "--holdout-column", help="With --table: a 1/0 column marking the rows held out of the fit."
)
PredictOption = typer.Option(
    None,
    "--predict",
    help="A .csv/.parquet of mixtures (a column per weight): write the chosen law's prediction and 95 % "
    "intervals for each, to <proposal's folder>/<file stem>.predicted.csv.",
)
SnrOption = typer.Option(
    None,
    "--snr",
    help="A seed group (harness run --seeds) of one mixture of the sweep's experiment: print each target's "
    "signal-to-noise ratio (greedy, eval_loss, gold_logprob per task: sd across the trials / sd across the seeds) "
    "and the greedy rate's CV error fitted directly vs through eval_loss and a logistic link; no proposal.",
)
ObjectiveSetOption = typer.Option(
    None,
    "--set",
    help="With a sweep directory: another objective, read from the trials' own columns, repeatable "
    "(objective.metric=eval_loss, objective.split=loss_heldout, objective.reduce=mean …; a new metric takes its own "
    "direction unless objective.direction is set): the law, the proposal and --verify / --budget / --steer then use "
    "it, and write under SWEEP_DIR/objective-<metric>-<split>-<hash>/.",
)
BootstrapOption = typer.Option(
    200, "--bootstrap", min=10, help="Resamples of the trials for the intervals (each refits the chosen form)."
)
FormOption = typer.Option(
    None,
    "--form",
    help="Forms to fit, repeatable: constant, scheffe, scheffe2, loglinear, gp (default all; constant is the "
    "reference a form must beat).",
)
SeedOption = typer.Option(0, "--seed", help="Seed of the bootstrap and of the search in the hull.")
VerifyOption = typer.Option(
    None,
    "--verify",
    help="Train the proposal and the in-sample winner on K fresh seeds (SWEEP_DIR/verify/) and compare them on "
    "the same held-out items; write SWEEP_DIR/verify.json (SWEEP_DIR: the --set objective's folder with --set, "
    "and its full-size/ with --full-size).",
)
BudgetOption = typer.Option(
    None,
    "--budget",
    help="With --verify: the budget curve, repeatable (--budget 4 --budget 8): the mixture proposed from the "
    "sweep's first k trials, trained on the same fresh seeds and compared with the full sweep's winner; write "
    "SWEEP_DIR/budget.json.",
)
SteerOption = typer.Option(
    None,
    "--steer",
    help="With --verify: train an adaptive method instead of a fixed mixture (one run per seed, from the uniform "
    "start; groupdro steers by the sweep's objective on a steering split), repeatable, and compare it with the "
    "winner on the same seeds; write SWEEP_DIR/steer.json.",
)
FullSizeOption = typer.Option(
    False,
    "--full-size",
    help="With --verify on a proxy sweep: train the arms at full size (the experiment without the sweep's "
    "proxy:), into <folder>/full-size/, instead of at the proxy's size.",
)
OutOption = typer.Option(
    None,
    "--out",
    help="Where proposal.json goes (default: SWEEP_DIR/proposal.json — the --set objective's folder with --set — or "
    "<table>.proposal.json).",
)


def mixture(
    sweep_dir: Path | None = typer.Argument(
        None, help="A sweep directory (trials.parquet, sweep.resolved.yaml); or give --table."
    ),
    table: Path | None = TableOption,
    weights: str | None = WeightsOption,
    objective: str | None = ObjectiveOption,
    direction: str | None = DirectionOption,
    seed_column: str | None = SeedColumnOption,
    proportion: bool = ProportionOption,
    tolerance: float = ToleranceOption,
    holdout: Path | None = HoldoutOption,
    holdout_column: str | None = HoldoutColumnOption,
    predict: Path | None = PredictOption,
    out: Path | None = OutOption,
    snr: Path | None = SnrOption,
    set_: list[str] | None = ObjectiveSetOption,
    bootstrap: int = BootstrapOption,
    form: list[str] | None = FormOption,
    seed: int = SeedOption,
    verify: int | None = VerifyOption,
    budget: list[int] | None = BudgetOption,
    steer: list[str] | None = SteerOption,
    full_size: bool = FullSizeOption,
    jobs: int = typer.Option(1, "--jobs", min=1, help="With --verify: runs at once on this machine (processes)."),
    launcher: str | None = LauncherOption,
    slurm: list[str] | None = SlurmOption,
    detach: bool = DetachOption,
):
    """Fit mixing laws to a sweep's trials (or a table of results), choose one by cross-validated error and propose
    the mixture that optimises the objective inside the explored mixtures; write proposal.json."""
    from analysis.mixing_laws import FORMS

    unknown = [f for f in form or [] if f not in FORMS]
    if unknown:
        raise_usage(f"harness mixture: --form {', '.join(unknown)}: use {', '.join(FORMS)}")
    options = {"forms": form or FORMS, "bootstrap": bootstrap, "seed": seed}
    if table is not None:
        if sweep_dir is not None:
            raise_usage("harness mixture: give a sweep directory or --table FILE, not both")
        if verify is not None or budget or steer or set_:
            raise_usage(
                "harness mixture: --verify, --budget, --steer and --set are about a sweep's experiment: "
                "not with --table"
            )
        table_args = {"weights": weights, "objective": objective, "direction": direction, "seed_column": seed_column}
        table_args |= {"proportion": proportion, "tolerance": tolerance, "holdout_column": holdout_column}
        _from_table(table, table_args, holdout, predict, out, options)
        return
    given = [f for f, v in (("--weights", weights), ("--objective", objective), ("--direction", direction)) if v]
    given += [f for f, v in (("--seed-column", seed_column), ("--holdout-column", holdout_column)) if v]
    if given or proportion:
        raise_usage(f"harness mixture: {', '.join(given) or '--proportion'} describe a --table's columns")
    if sweep_dir is None:
        raise_usage("harness mixture: give a sweep directory or --table FILE")
    if snr is not None:
        if verify is not None or holdout is not None or predict is not None or set_:
            raise_usage("harness mixture: --snr is a report of its own: not with --verify, --holdout, --predict, --set")
        _snr_report(sweep_dir, snr, (form or ["loglinear"])[-1])
        return
    if full_size and verify is None:
        raise_usage("harness mixture: --full-size trains the verification's arms: it needs --verify K")
    launching = (jobs, launcher, slurm, detach)
    _from_sweep(sweep_dir, holdout, predict, out, options, (verify, full_size), budget, steer, launching, set_ or [])


def _say_proxies(config: dict, held_config: dict | None) -> None:
    """Say when the trials fitted on (or held out) are proxies of the experiment (the sweep file's ``proxy:``)."""
    from harness.studies.sweep.spec import proxy_text

    if config.get("proxy"):
        typer.echo(f"fitted on: proxy trials ({proxy_text(config['proxy'])})")
    if held_config is None:
        return
    if held_config.get("proxy"):
        typer.echo(f"held out: proxy trials ({proxy_text(held_config['proxy'])})")
    elif config.get("proxy"):
        typer.echo("held out: full-size trials (no proxy)")


def _one_line(error) -> str:
    """A :class:`~harness.config.ConfigError` in one line: every ``path: message`` and the file."""
    said = "; ".join(f"{where}: {what}" if where else what for where, what in error.errors)
    return f"{said} ({error.source})"


def _retargeted(sweep_dir: Path, items: list[str], verifying: tuple[int | None, bool]):
    """``--set objective.…`` items applied to the sweep: ``(sweep, config, folder)`` — the sweep with the new objective
    (validated against its experiment as the sweep file's own; at full size with ``--full-size``; None when neither
    items nor ``--verify`` need the experiment), its ``sweep.resolved.yaml`` with that objective, and the folder
    everything this command writes goes to (the sweep directory itself without items)."""
    from analysis.loading import read_sweep_config
    from harness.config import ConfigError
    from harness.core.digests import content_hash
    from harness.studies.sweep import RESOLVED_NAME, load_resolved, load_sweep
    from harness.studies.sweep.load import at_full_size

    config = read_sweep_config(sweep_dir)
    wrong = [item for item in items if not item.partition("=")[0].strip().startswith("objective.")]
    if wrong:
        raise_usage(f"harness mixture: --set {wrong[0]}: only objective.<key>=<value> (the trials are what they are)")
    if items and config.get("objectives"):
        raise_usage("harness mixture: --set objective.…: the sweep has several objectives (a Pareto front)")
    if not items and verifying[0] is None:  # a proposal reads the trials and the resolved file alone
        return None, config, Path(sweep_dir)
    keys = {item.partition("=")[0].strip() for item in items}
    if "objective.metric" in keys and "objective.direction" not in keys:
        # the resolved file spells the old metric's direction out: a new metric takes its own (a loss is minimised)
        items = [*items, "objective.direction=null"]
    try:
        sweep = load_sweep(Path(sweep_dir) / RESOLVED_NAME, items) if items else load_resolved(sweep_dir)
    except ConfigError as e:
        said = "--set " if items else "--verify needs the sweep's experiment: "
        raise_usage(f"harness mixture: {said}{_one_line(e)}")
    if verifying[1]:
        try:
            sweep = at_full_size(sweep)
        except ConfigError as e:
            raise_usage(f"harness mixture --full-size: {_one_line(e)}")
    if not items:
        return sweep, config, Path(sweep_dir)
    objective = sweep.objectives[0].to_yaml()
    digest = content_hash(objective)[:8]
    folder = Path(sweep_dir) / f"objective-{objective['metric']}-{objective['split']}-{digest}"
    return sweep, {**config, "objective": objective}, folder


def _from_sweep(sweep_dir, holdout, predict, out, options, verifying, budget, steer, launching, items):
    """The proposal from a sweep directory, then ``--verify`` / ``--budget`` / ``--steer`` as asked (``verifying``:
    ``(K or None, at full size)``)."""
    from analysis.loading import AnalysisError, is_sweep_dir, load_sweep, read_sweep_config
    from analysis.mixture_data import sweep_law_data
    from analysis.mixture_proposal import PROPOSAL_NAME, budget_choice, budget_row
    from analysis.trials import objective_columns

    if not is_sweep_dir(sweep_dir):
        raise_usage(f"harness mixture: {sweep_dir}: not a sweep directory (no trials.parquet)")
    if holdout is not None and not is_sweep_dir(holdout):
        raise_usage(f"harness mixture: --holdout {holdout}: not a sweep directory (no trials.parquet)")
    verify, full_size = verifying
    _check_launching(verify, *launching)
    if budget and verify is None:
        raise_usage("harness mixture: --budget trains each budget's mixture: it needs --verify K")
    _check_steer(steer, verify)
    sweep, config, folder = _retargeted(sweep_dir, items, verifying)
    choice = _verify_choice(sweep, verify, *launching)

    def trials_of(directory: Path):  # a recorded objective is the sweep's own: --set's is reduced from the targets
        frame = load_sweep(directory)
        return frame.drop(objective_columns(frame)) if items else frame

    trials = trials_of(sweep_dir)
    if items:
        typer.echo(f"objective: {json.dumps(config['objective'])} (--set; written under {folder})")
    too_many = [k for k in budget or [] if not 1 <= k < len(trials)]
    if too_many:
        raise_usage(
            f"harness mixture: --budget {too_many[0]}: a budget is fewer trials than the sweep's {len(trials)} (all "
            "of them is the full sweep's row)"
        )
    _say_proxies(config, read_sweep_config(holdout) if holdout is not None else None)
    try:
        data = sweep_law_data(trials, config, str(sweep_dir))
        held = sweep_law_data(trials_of(holdout), config, str(holdout)) if holdout is not None else None
    except AnalysisError as e:
        raise_usage(f"harness mixture: {e}")
    folder.mkdir(exist_ok=True)
    proposal = _propose(data, held, predict, out or folder / PROPOSAL_NAME, options)
    if verify is None:
        return
    rows = [budget_choice(trials, config, k, **options) for k in sorted(set(budget or []))]
    for row in rows:
        mixture = ", ".join(f"{t} {w:.3f}" for t, w in (row["mixture"] or {}).items()) or "nothing to train"
        typer.echo(f"first {row['k']} trials: {row['basis']} ({row['why']}) → {mixture}")
    if rows:
        rows.append(budget_row(proposal.to_json(), "all"))
    jobs, detach, runs_in = launching[0], launching[3], folder / "full-size" if full_size else folder
    _verify(sweep, runs_in, proposal.to_json(), trials.to_dicts(), verify, jobs, choice, detach, rows, steer or [])


def _snr_report(sweep_dir: Path, group_dir: Path, form: str) -> None:
    """``--snr``: the SNR table of the sweep's targets against a seed group, and the two routes' CV error."""
    from analysis.loading import AnalysisError, is_sweep_dir, load_sweep, read_sweep_config
    from analysis.mixture_snr import format_route_table, format_snr_table, route_table, snr_table

    if not is_sweep_dir(sweep_dir):
        raise_usage(f"harness mixture: {sweep_dir}: not a sweep directory (no trials.parquet)")
    trials, config = load_sweep(sweep_dir), read_sweep_config(sweep_dir)
    splits = [s for s in ("heldout", "heldout_template") if any(f"/{s}/" in c for c in trials.columns)]
    try:
        typer.echo(format_snr_table(snr_table(trials, group_dir, splits=splits or ["heldout"])))
    except AnalysisError as e:
        raise_usage(f"harness mixture --snr: {e}")
    try:
        typer.echo(format_route_table(route_table(trials, config.get("space"), form)))
    except AnalysisError as e:
        typer.echo(f"no loss → greedy link: {e}")


def _from_table(table: Path, table_args: dict, holdout, predict, out, options) -> None:
    """The proposal from a table of results (and its held-out rows or table)."""
    from analysis.loading import AnalysisError
    from analysis.mixture_table import table_law_data

    missing = [f"--{k}" for k in ("weights", "objective", "direction") if not table_args[k]]
    if missing:
        raise_usage(f"harness mixture --table: give {', '.join(missing)} (the table's columns and objective)")
    if holdout is not None and table_args["holdout_column"]:
        raise_usage("harness mixture: --holdout FILE or --holdout-column COLUMN, not both")
    table_args = {**table_args, "weights": table_args["weights"].split(",")}
    try:
        data, held = table_law_data(table, **table_args)
        if holdout is not None:
            held, _ = table_law_data(holdout, **{**table_args, "holdout_column": None})
    except AnalysisError as e:
        raise_usage(f"harness mixture: {e}")
    _propose(data, held, predict, out or table.with_suffix(".proposal.json"), options)


def _propose(data, held, predict: Path | None, out: Path, options: dict):
    """Fit, choose and propose (the same for a sweep and a table), print it, write ``out`` and the predictions."""
    from analysis.loading import AnalysisError
    from analysis.mixture_proposal import format_proposal, propose_data
    from analysis.mixture_table import predictions_frame, read_mixtures
    from harness.core.store import atomic_write_text

    try:
        mixtures = read_mixtures(predict, data.weights) if predict is not None else None
        at = mixtures.select(data.weights).to_numpy() if mixtures is not None else None
        proposal = propose_data(data, **options, holdout=held, predict_at=at)
    except AnalysisError as e:
        raise_usage(f"harness mixture: {data.source}: {e}" if data.kind == "table" else f"harness mixture: {e}")
    typer.echo(format_proposal(proposal))
    atomic_write_text(out, json.dumps(proposal.to_json(), indent=2) + "\n")
    typer.echo(f"proposal → {out}")
    if mixtures is not None:
        path = out.parent / f"{predict.stem}.predicted.csv"
        frame = predictions_frame(mixtures, data.targets, proposal.predictions)
        atomic_write_text(path, frame.write_csv())
        typer.echo(f"predictions for {frame.height} mixtures (95 % intervals: bootstrap over rows) → {path}")
    return proposal


def _check_steer(steer: list[str] | None, verify: int | None) -> None:
    """One line, exit 2, for --steer without --verify or with a method that is not a controller."""
    if not steer:
        return
    if verify is None:
        raise_usage("harness mixture: --steer trains each method on the fresh seeds: it needs --verify K")
    from harness.core.registry import MIXTURE_CONTROLLERS, suggest

    known = MIXTURE_CONTROLLERS.names()
    for method in steer:
        if method not in MIXTURE_CONTROLLERS:
            raise_usage(
                f"harness mixture: --steer {method}: unknown method{suggest(method, known)}; known: {', '.join(known)}"
            )


def _check_launching(verify, jobs: int, launcher, slurm, detach: bool) -> None:
    """One line, exit 2, for launch options that cannot be used, before the sweep is loaded."""
    if verify is None and (jobs > 1 or launcher or slurm or detach):
        raise_usage("harness mixture: --jobs, --launcher, --slurm and --detach launch the runs of --verify K")
    if verify is not None and verify < 1:
        raise_usage(f"harness mixture: --verify {verify}: give the number of fresh seeds, at least 1")


def _verify_choice(sweep, verify, jobs: int, launcher, slurm, detach: bool):
    """The launcher of ``--verify`` (None without it), from ``sweep``'s launcher section (the sweep as
    :func:`_retargeted` loaded it); one line, exit 2, for options that cannot be used together."""
    if verify is None:
        return None
    choice = choose_launcher(sweep.spec.launcher, launcher, slurm)
    if choice.kind == "slurm" and jobs > 1:
        raise_usage(
            "harness mixture: --jobs is for this machine: on SLURM each run is a job (--slurm array_parallelism=N)"
        )
    if detach and choice.kind != "slurm":
        raise_usage("harness mixture: --detach leaves SLURM jobs running: it needs --launcher slurm")
    return choice


def _verify(
    sweep,
    sweep_dir: Path,
    proposal: dict,
    trials: list[dict],
    k: int,
    jobs: int,
    choice,
    detach: bool,
    rows: list[dict],
    steer: list[str],
) -> None:
    """Train both arms of ``sweep`` on ``k`` fresh seeds into ``sweep_dir`` (the sweep's directory, or its
    ``--set`` objective's folder), print the comparison, write ``verify.json``; with budget ``rows``,
    train each row's mixture on the same seeds too and write ``budget.json``; with ``steer`` methods, each steered
    arm, and write ``steer.json``."""
    from harness.config import ConfigError
    from harness.studies.launch import JobsFailed, make_launcher
    from harness.studies.mixture_budget import BUDGET_NAME, format_budget, verify_budget
    from harness.studies.mixture_steer import STEER_NAME, format_steering, steering_plan, verify_steering
    from harness.studies.mixture_verify import VERIFY_DIR, VERIFY_NAME, format_verification, verify

    Path(sweep_dir).mkdir(exist_ok=True)
    folder = Path(sweep_dir) / VERIFY_DIR / "slurm"
    runs = make_launcher(
        choice, folder, jobs=jobs, echo=typer.echo, job_name=f"harness-verify-{sweep.name}", detach=detach
    )
    written = ", ".join(["verify.json"] + (["budget.json"] if rows else []) + (["steer.json"] if steer else []))
    try:
        plan = steering_plan(sweep, proposal, trials, steer, k) if steer else None  # refused now, before training
        report = verify(sweep, Path(sweep_dir), proposal, trials, k, runs, typer.echo)
        if report is not None:
            typer.echo(format_verification(report))
            typer.echo(f"verification → {Path(sweep_dir) / VERIFY_NAME}")
        # the budget's arms after the verification's two (reused here): verify.json is written even if one fails
        curve = (
            verify_budget(sweep, Path(sweep_dir), proposal, rows, trials, k, runs, typer.echo)
            if report and rows
            else None
        )
        steered = (
            verify_steering(sweep, Path(sweep_dir), proposal, plan, trials, runs, typer.echo)
            if report and steer
            else None
        )
    except (ConfigError, ValueError) as e:
        raise_usage(f"harness mixture --verify: {e}")
    except JobsFailed as e:
        raise_usage(f"harness mixture --verify: {e}", 1)
    if report is None or (rows and curve is None) or (steer and steered is None):
        typer.echo(f"the jobs run on: this command again follows them, then writes {written}")
        return
    if curve is not None:
        typer.echo(format_budget(curve))
        typer.echo(f"budget curve → {Path(sweep_dir) / BUDGET_NAME}")
    if steered is not None:
        typer.echo(format_steering(steered))
        typer.echo(f"steering → {Path(sweep_dir) / STEER_NAME}")
