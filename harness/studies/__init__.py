"""Studies made of many runs: optuna sweeps (:mod:`.sweep`), published reproductions (:mod:`.repro`) and seed
replicates (:mod:`.replicates`)."""
