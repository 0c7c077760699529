"""One stage of SFT: the loop (read top to bottom), the training forward, losses (CE, GEM, weights), what trains
(full, LoRA / HiRA, new token rows), the non-finite guard, training health, compiling, checkpoints and resume
points, and several ranks (:mod:`.parallel`). Knows nothing of runs, evaluation or run directories."""
