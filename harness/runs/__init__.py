"""An experiment end to end: task data, base model and stage plans (:mod:`.prepare`), the runner, the stage cache,
run directories, where results go (store, wandb, console, samples), and a distributed run's ranks. Sits on
training and evaluation; knows nothing of sweeps, reproductions or checks."""
