"""Studies made of many runs: optuna sweeps (:mod:`.sweep`), published reproductions (:mod:`.repro`) and seed
replicates (:mod:`.replicates`), and the launchers that run them here or as SLURM job arrays (:mod:`.launch`)."""
