"""The ground floor: statistics (intervals, paired tests, false-discovery correction), the seesaw test over stored
rows, the metrics store and the names of the metric contract, kill-safe JSON lines, registries, names and
redaction. Imports nothing else of the harness; ``analysis`` and ``data_recipes`` may import only this layer."""
