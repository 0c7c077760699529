"""The stage mixture stream: which task's example each draw of a stage takes (weights | natural | counts)."""

from __future__ import annotations

import numpy as np

from harness.config import Mixture


def mixture_stream(
    mixture: Mixture, pool_sizes: dict[str, int], n_examples: int, rng: np.random.Generator
) -> list[tuple[str, int]]:
    """The stage's sequence of ``(task, pool index)`` draws, exactly ``n_examples`` long (counts: Σ counts).

    - weights: the task of every draw is sampled with probability w/Σw; within a task, examples are taken in a
      fresh random order each pass over its pool (so no example repeats before the whole pool has been seen);
    - natural: the stage's pools are concatenated and shuffled, and reshuffled for each further pass;
    - counts: exactly ``counts[t]`` examples of task t (without replacement unless ``replace``), shuffled.

    (``datasets.interleave_datasets`` does the weights case, but it ends or oversamples when a pool runs out,
    which changes the effective proportions; a stage here is a fixed number of steps with stated semantics.)
    """
    if mixture.kind == "weights":
        tasks = mixture.tasks
        probs = np.array([mixture.weights[t] for t in tasks], dtype=np.float64)
        choice = rng.choice(len(tasks), size=n_examples, p=probs / probs.sum())
        cursors = {t: Cycler(pool_sizes[t], rng) for t in tasks}
        return [(tasks[c], cursors[tasks[c]].next()) for c in choice]
    if mixture.kind == "natural":
        everything = [(t, i) for t in mixture.tasks for i in range(pool_sizes[t])]
        out: list[tuple[str, int]] = []
        while len(out) < n_examples:
            order = rng.permutation(len(everything))
            out.extend(everything[j] for j in order[: n_examples - len(out)])
        return out
    draws = []
    for task, n in mixture.counts.items():
        if mixture.replace:
            idx = rng.integers(0, pool_sizes[task], size=n)
        else:
            idx = rng.permutation(pool_sizes[task])[:n]
        draws.extend((task, int(i)) for i in idx)
    return [draws[j] for j in rng.permutation(len(draws))]


class Cycler:
    """Indices 0..n-1 in a random order, reshuffled at each pass."""

    def __init__(self, n: int, rng: np.random.Generator):
        self.n, self.rng, self.order, self.pos = n, rng, rng.permutation(n), 0

    def next(self) -> int:
        if self.pos == self.n:
            self.order, self.pos = self.rng.permutation(self.n), 0
        self.pos += 1
        return int(self.order[self.pos - 1])
