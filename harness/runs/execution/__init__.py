"""Executing a run's plan: the runner (stages trained, evaluated, checkpointed and summarised), the evaluation log,
the stage cache, run directories, tracking (store, wandb, console), packing decided on the model, and a distributed
run's process ranks. Below the functions that open a run directory, it reads the plan :mod:`harness.runs.planning`
compiled, never the experiment."""
