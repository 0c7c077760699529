"""``harness mixture --table`` on a synthetic table with a planted law, RegMix's scale (17 domains, 512 runs): how
close the proposal comes to the law's optimum (L1 distance), how well the chosen law ranks 256 held-out mixtures
(Spearman ρ of the objective, with its bootstrap interval), and how long the command takes (wall and CPU time: on
a shared machine the wall time counts the other jobs).

The planted law is Ye et al. 2024's data mixing law per domain, ``L_i(w) = c_i + k_i · exp(−a_i w_i + Σ_j b_ij
w_j)`` (each domain's loss falls with its own weight, other domains help or hurt it a little), plus Gaussian
noise; the objective is the mean loss over the 17 domains, whose optimum is interior. Mixtures are uniform
Dirichlet draws. :func:`planted_table` is also the tests' generator (tests/analysis/test_mixture_table.py)::

    python bench/mixture_table_check.py                       # 512 + 256 rows, 17 domains, every form
    python bench/mixture_table_check.py --form constant --form scheffe --form loglinear
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl
from scipy import optimize


def planted_law(domains: int, seed: int = 0):
    """The planted law as a function of mixtures (rows) to the domains' losses (columns)."""
    rng = np.random.default_rng(seed)
    c = rng.uniform(1.5, 3.0, domains)
    k = rng.uniform(0.8, 1.25, domains)
    a = rng.uniform(6.0, 9.0, domains)
    b = rng.normal(0.0, 0.1, (domains, domains))
    np.fill_diagonal(b, 0.0)
    exponent = b - np.diag(a)  # row i: the exponent of domain i's loss over the weights

    def law(W: np.ndarray) -> np.ndarray:
        return c + k * np.exp(np.atleast_2d(W) @ exponent.T)

    return law


def law_optimum(law, domains: int) -> np.ndarray:
    """The mixture minimising the mean loss over the whole simplex (softmax parametrisation, BFGS)."""
    f = lambda x: law(np.exp(x - x.max()) / np.exp(x - x.max()).sum())[0].mean()  # noqa: E731
    x = optimize.minimize(f, np.zeros(domains), method="BFGS", options={"gtol": 1e-10}).x
    return np.exp(x - x.max()) / np.exp(x - x.max()).sum()


def planted_table(rows: int, heldout: int, domains: int = 17, noise: float = 0.01, seed: int = 0):
    """A results table: ``w_<d>`` weights, ``loss_<d>`` outcomes, a ``heldout`` 1/0 column marking the last
    ``heldout`` rows; with the law and its optimum."""
    law = planted_law(domains, seed)
    rng = np.random.default_rng(seed + 1)
    W = rng.dirichlet(np.ones(domains), size=rows + heldout)
    Y = law(W) + rng.normal(0.0, noise, (rows + heldout, domains))
    data = {f"w_{d:02d}": W[:, d] for d in range(domains)}
    data |= {f"loss_{d:02d}": Y[:, d] for d in range(domains)}
    data["heldout"] = [0] * rows + [1] * heldout
    return pl.DataFrame(data), law, law_optimum(law, domains)


def run(rows: int, heldout: int, domains: int, forms: list[str], bootstrap: int) -> dict:
    """Write the table, run the command in this process, read the proposal: L1, held-out ρ, seconds."""
    import json

    from typer.testing import CliRunner

    from harness.cli.app import app

    table, law, optimum = planted_table(rows, heldout, domains)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "swarm.csv"
        table.write_csv(path)
        args = ["mixture", "--table", str(path), "--weights", "w_*", "--objective", "mean(loss_*)"]
        args += ["--direction", "minimize", "--holdout-column", "heldout", "--bootstrap", str(bootstrap)]
        args += [x for f in forms for x in ("--form", f)]
        start, cpu = time.perf_counter(), time.process_time()
        result = CliRunner().invoke(app, args)
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
        if result.exit_code != 0:
            sys.exit(result.output)
        proposal = json.loads(path.with_suffix(".proposal.json").read_text())
    w = np.array([proposal["mixture"][f"w_{d:02d}"] for d in range(domains)])
    return {
        "seconds": seconds,
        "cpu_seconds": cpu,  # the process's CPU time: the wall time on a shared machine counts other jobs too
        "chosen": proposal["chosen"],
        "supported": proposal["supported"],
        "l1": float(np.abs(w - optimum).sum()),
        "regret": float(law(w)[0].mean() - law(optimum)[0].mean()),
        "holdout": proposal["holdout"]["objective"],
        "output": result.output,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=512)
    parser.add_argument("--heldout", type=int, default=256)
    parser.add_argument("--domains", type=int, default=17)
    parser.add_argument("--bootstrap", type=int, default=200)
    parser.add_argument("--form", action="append", help="Forms (repeatable; default every form).")
    args = parser.parse_args()
    from analysis.mixing_laws import FORMS

    r = run(args.rows, args.heldout, args.domains, args.form or list(FORMS), args.bootstrap)
    print(r["output"])
    h = r["holdout"]
    print(
        f"{args.rows} rows + {args.heldout} held out, {args.domains} domains: {r['seconds']:.1f} s wall, "
        f"{r['cpu_seconds']:.1f} s CPU; chosen "
        f"{r['chosen']} (supported: {r['supported']}); L1 to the planted optimum {r['l1']:.4f} (regret "
        f"{r['regret']:.5f}); held-out Spearman rho {h['rho']:.3f} [{h['rho_low']:.3f}, {h['rho_high']:.3f}]"
    )


if __name__ == "__main__":
    main()
