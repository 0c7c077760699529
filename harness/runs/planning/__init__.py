"""Compiling an experiment into the plan a run executes: task data from the recipes (and their split check), the
base model, the encoded pools and eval items, each stage's batches, the steering splits and the stage-cache keys
(with the code and kernel path they cover). Past opening its run directory, the only part of a run that reads the
whole ``Experiment``; what it builds is :class:`harness.runs.planning.plan.RunPlan`."""
