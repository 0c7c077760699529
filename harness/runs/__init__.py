"""An experiment end to end, in two halves: :mod:`.planning` compiles the experiment once into a
:class:`~harness.runs.planning.plan.RunPlan` (task data, base model, encoded pools, stage plans, steering splits,
stage-cache keys, what is evaluated and where results go), and :mod:`.execution` runs that plan (the runner, the
evaluation log, the stage cache, run directories, tracking, a distributed run's process ranks). Sits on training and
evaluation; knows nothing of sweeps, reproductions or checks."""
