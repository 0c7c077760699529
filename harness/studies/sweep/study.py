"""The optuna plumbing of a sweep: the storage (an RDB URL or a journal file, whose appends an ``flock`` guards;
``HARNESS_STORAGE`` when the sweep file names none), the lock around the trial budget (an ``flock`` on one machine,
a PostgreSQL advisory lock across machines), the sampler and pruner a study spec asks for, and
:func:`prepare_study`, which creates (or reopens) the study and writes the files workers read."""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import threading
import warnings
from pathlib import Path

import optuna
import sqlalchemy
from optuna.storages.journal import JournalFileBackend, JournalFileSymlinkLock
from sqlalchemy.exc import SQLAlchemyError

from harness.config import ConfigError, dump_yaml
from harness.core.jsonl import trim_unfinished_last_line
from harness.core.redact import mask_url, mask_urls_in_text
from harness.core.store import atomic_write_text
from harness.studies.sweep.design import DESIGNS, design_sampler
from harness.studies.sweep.space import Sweep, seed_trial_params
from harness.studies.sweep.spec import BASE_EXPERIMENT_NAME, FULL_EXPERIMENT_NAME, RESOLVED_NAME

try:
    import fcntl
except ImportError:  # pragma: no cover — not on POSIX: optuna's own symlink lock is used
    fcntl = None

FINGERPRINT_ATTR = "harness:sweep"


class FlockJournalLock:
    """An ``fcntl.flock`` on ``<journal>.flock``, in the shape of optuna's journal file locks (``acquire`` /
    ``release``; optuna does not export their base class, and only calls these two methods).

    With ``journal``, the lock also repairs that journal once it holds it: an unfinished last line (a writer killed
    or a disk filled mid-append) is cut off before the next append, which would otherwise glue a new record to it
    and make the line unparseable for every later reader (optuna skips a bad *last* line, not a bad middle one)."""

    def __init__(self, path: str, journal: str | None = None):
        self.path, self.journal = path, journal
        self._held = threading.local()  # a descriptor per thread: flock excludes between descriptors

    def acquire(self) -> bool:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except BaseException:
            os.close(fd)
            raise
        self._held.fd = fd
        if self.journal is not None:
            trim_unfinished_last_line(self.journal)
        return True

    def release(self) -> None:
        fd = getattr(self._held, "fd", None)
        if fd is None:
            raise RuntimeError(f"{self.path}: released without being held")
        self._held.fd = None
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def journal_lock(journal_path: str):
    """The lock that serialises appends to the journal file.

    optuna's default (a symlink lock) survives its holder: a worker killed while appending — a heartbeat is
    appended every second, so this is not rare — leaves the lock file behind and every other process waits its
    30 s grace period before breaking it, by which time the dead worker's heartbeat looks stale too. An ``flock``
    is released by the kernel when its holder dies, so on POSIX the study carries on at once. (flock is unreliable
    on some network file systems: a journal shared across machines should be an RDB storage anyway.)"""
    if fcntl is None:  # pragma: no cover — not on POSIX
        return JournalFileSymlinkLock(journal_path)
    return FlockJournalLock(journal_path + ".flock", journal=journal_path)


def make_storage(url: str):
    """An optuna storage: RDB for URLs (``sqlite:///…``, ``postgresql://…``, ``mysql://…``), else a journal file."""
    if "://" in url:
        return optuna.storages.RDBStorage(
            url, engine_kwargs={"pool_pre_ping": True} if not url.startswith("sqlite") else None
        )
    Path(url).parent.mkdir(parents=True, exist_ok=True)
    return optuna.storages.JournalStorage(JournalFileBackend(url, lock_obj=journal_lock(url)))


def _advisory_key(study_name: str) -> int:
    """A signed 64-bit key for ``pg_advisory_lock``, the same on every machine for one study."""
    return int.from_bytes(hashlib.sha256(f"harness-budget:{study_name}".encode()).digest()[:8], "big", signed=True)


@contextlib.contextmanager
def budget_lock(sweep_dir: Path, url: str, study_name: str):
    """Serialise "count the trials, then ask for one" among workers, so a study ends with exactly ``n_trials``.

    On PostgreSQL the lock is a session advisory lock in the database itself, so workers on every machine share
    it (and the server releases it when a worker's connection dies). Elsewhere it is an ``flock`` in the sweep
    directory, which covers the workers that share that directory."""
    if url.startswith("postgresql"):
        engine = sqlalchemy.create_engine(url, poolclass=sqlalchemy.pool.NullPool)
        try:
            with engine.connect() as conn:
                conn.execute(sqlalchemy.text("SELECT pg_advisory_lock(:k)"), {"k": _advisory_key(study_name)})
                try:
                    yield
                finally:
                    conn.execute(sqlalchemy.text("SELECT pg_advisory_unlock(:k)"), {"k": _advisory_key(study_name)})
        finally:
            engine.dispose()
        return
    if fcntl is None:  # pragma: no cover — not on POSIX: the budget may overshoot by a trial per racing worker
        yield
        return
    with open(Path(sweep_dir) / ".budget.lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def sampler_seed(study_seed: int, worker_index: int, launch: int = 0) -> int:
    """``study_seed + worker_index`` for a new sweep. A sweep continued by a later launch (``launch``: the trials
    started before it — COMPLETE, PRUNED, FAIL or RUNNING — counted once by its launcher) gets seeds of its own: the
    same seeds would replay the first launch's random start-up proposals, so its first new trial would repeat trial
    0's parameters."""
    if launch == 0:
        return study_seed + worker_index
    digest = hashlib.sha256(f"{study_seed}:{worker_index}:{launch}".encode()).hexdigest()
    return int(digest[:8], 16)


def make_sampler(sweep: Sweep, worker_index: int, launch: int = 0):
    """The study's sampler for worker ``worker_index`` (seeded by :func:`sampler_seed`)."""
    s = sweep.spec.study
    seed = sampler_seed(s.seed, worker_index, launch)
    args = dict(s.sampler_args)
    if s.sampler == "tpe":
        args.setdefault("constant_liar", True)  # parallel workers: running trials count as bad guesses
        return optuna.samplers.TPESampler(seed=seed, **args)
    if s.sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed, **args)
    if s.sampler in DESIGNS:  # the study seed, not the worker's: trial k's point is the same on every worker
        return design_sampler(sweep, s.seed, args)
    if s.sampler == "gp":
        if importlib.util.find_spec("scipy") is None:
            raise ImportError("the gp sampler needs scipy: pip install scipy")
        return optuna.samplers.GPSampler(seed=seed, **args)
    return optuna.samplers.NSGAIISampler(seed=seed, **args)


def _steps_are_swept(sweep: Sweep) -> bool:
    """Whether a parameter can change how many steps a trial runs (then hyperband's max resource is "auto")."""
    return any(
        p.kind == "fraction" or {"steps", "counts", "batch_size"} & {str(x) for x in p.parts} for p in sweep.params
    )


def make_pruner(sweep: Sweep):
    """The pruner; hyperband's resources are global steps (min: ``eval.every``, max: the experiment's total)."""
    s = sweep.spec.study
    if s.pruner == "none" or sweep.multi:
        return optuna.pruners.NopPruner()
    if s.pruner == "median":
        return optuna.pruners.MedianPruner(**s.pruner_args)
    args = dict(s.pruner_args)
    args.setdefault("min_resource", sweep.base.eval.every)
    if "max_resource" not in args:
        args["max_resource"] = (
            "auto" if _steps_are_swept(sweep) else sum(st.steps for st in sweep.base.resolved_stages())
        )
    return optuna.pruners.HyperbandPruner(**args)


def quiet_optuna() -> None:
    """Keep optuna's logging to warnings and errors, without its ExperimentalWarnings."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


def prepare_study(sweep: Sweep, sweep_dir: Path):
    """Write ``experiment.yaml`` and ``sweep.resolved.yaml`` into ``sweep_dir``, create (or load) the study and
    enqueue the seed trials when it is new; returns the study. A study that exists with a different space or
    objectives is refused (:class:`ConfigError`)."""
    quiet_optuna()
    sweep_dir = Path(sweep_dir)
    sweep_dir.mkdir(parents=True, exist_ok=True)
    url = sweep.storage_url(sweep_dir)
    try:
        storage = make_storage(url)
        study = optuna.create_study(
            study_name=sweep.name,
            storage=storage,
            directions=sweep.directions,
            load_if_exists=True,
            sampler=make_sampler(sweep, 0),
            pruner=make_pruner(sweep),
        )
    except (ImportError, OSError, ValueError, SQLAlchemyError) as e:  # no driver, unreachable host, bad URL
        raise ConfigError(
            sweep.source,
            [("study.storage", f"cannot open {mask_url(url)}: {mask_urls_in_text(str(e)).splitlines()[0]}")],
        ) from None
    fingerprint = study.user_attrs.get(FINGERPRINT_ATTR)
    if fingerprint is None:
        study.set_user_attr(FINGERPRINT_ATTR, sweep.fingerprint())
        study.set_user_attr("harness:objectives", [o.to_yaml() for o in sweep.objectives])
        study.set_user_attr(
            "harness:space", {p.path: p.spec.model_dump(mode="json", by_alias=True) for p in sweep.params}
        )
    elif fingerprint != sweep.fingerprint():
        raise ConfigError(
            sweep.source,
            [
                (
                    "study.name",
                    f"study {sweep.name!r} already exists in {mask_url(url)} "
                    "with another space, objectives or proxy; choose another study.name "
                    "or --out",
                )
            ],
        )
    if [d.name.lower() for d in study.directions] != sweep.directions:
        raise ConfigError(sweep.source, [("study.name", f"study {sweep.name!r} exists with other directions")])
    if not study.get_trials(deepcopy=False):
        for _, params in seed_trial_params(sweep):
            study.enqueue_trial(params, skip_if_exists=True)
    atomic_write_text(sweep_dir / BASE_EXPERIMENT_NAME, dump_yaml(sweep.base_raw))
    if sweep.full_raw is not None:  # what the proxy trials stand for: harness mixture --verify K --full-size
        atomic_write_text(sweep_dir / FULL_EXPERIMENT_NAME, dump_yaml(sweep.full_raw))
    header = f"# resolved from {sweep.source}; workers read this file\n"
    resolved = sweep.resolved_yaml()
    if sweep.spec.study.storage and "://" not in sweep.spec.study.storage:
        resolved["study"]["storage"] = url
    atomic_write_text(sweep_dir / RESOLVED_NAME, header + dump_yaml(resolved))
    return study
