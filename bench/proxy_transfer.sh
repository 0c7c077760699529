#!/usr/bin/env bash
# Rank transfer from proxy trials to full-size runs on the shipped six-task sweep (issue 52, item 2;
# docs/sweeps.md, "Proxy trials"). Run after bench/mixture_snr.sh OUT, whose full-size sweep OUT/sweep becomes the
# held-out mixtures:
#
#   bench/proxy_transfer.sh OUT     # PROXY_TRIALS (32), FULL_TRIALS (14), PROXY_STEPS (325) override
#
# 1. OUT/sweep continued to FULL_TRIALS full-size trials (the held-out mixtures);
# 2. OUT/proxy.yaml: the same sweep with `proxy: {stages.assistant.steps: PROXY_STEPS, eval.every: 100000}`, its
#    own sampler seed and no seed trials (the uniform and natural mixtures stay held out), PROXY_TRIALS trials;
# 3. the proxy at each held-out mixture (OUT/proxy_at_full/<trial>), for the proxy's raw rank transfer;
# 4. bench/proxy_transfer.py: the table, (b) per target; then harness mixture --table ... --holdout-column: (a).
# Trials and runs use one torch thread each, two at a time.
set -euo pipefail
cd "$(dirname "$0")/.."
out=$1
proxy_trials=${PROXY_TRIALS:-32}
full_trials=${FULL_TRIALS:-14}
proxy_steps=${PROXY_STEPS:-325}
py=${PYTHON:-python}
export OMP_NUM_THREADS=1

"$py" - "$out" "$proxy_trials" "$proxy_steps" <<'PY'
import sys
from pathlib import Path

import yaml

out, trials, steps = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
sweep = yaml.safe_load((out / "sweep.yaml").read_text())
sweep["proxy"] = {"stages.assistant.steps": steps, "eval.every": 100000}
sweep["study"].update(name="yesno_vs_qa_proxy", n_trials=trials, seed=10)
sweep["seed_trials"] = False
(out / "proxy.yaml").write_text(yaml.safe_dump(sweep, sort_keys=False))
PY

start=$(date +%s)
harness sweep "$out/sweep.yaml" --workers 2 --out "$out/sweep" --set "study.n_trials=$full_trials"
echo "full-size sweep continued to $full_trials trials: $(($(date +%s) - start)) s" | tee -a "$out/times.txt"
start=$(date +%s)
harness sweep "$out/proxy.yaml" --workers 2 --out "$out/proxy"
echo "proxy sweep, $proxy_trials trials: $(($(date +%s) - start)) s" | tee -a "$out/times.txt"

start=$(date +%s)
"$py" - "$out" <<'PY'
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import polars as pl

out = Path(sys.argv[1])
trials = pl.read_parquet(out / "sweep" / "trials.parquet").filter(pl.col("state") == "COMPLETE")
prefix = "param/stages.assistant.mixture."


def run(t: dict) -> int:
    if (out / "proxy_at_full" / str(t["number"]) / "summary.json").is_file():
        return 0
    mixture = json.dumps({c[len(prefix):]: t[c] for c in t if c.startswith(prefix)})
    command = ["harness", "run", str(out / "proxy" / "experiment.yaml"), "--set", f"stages.assistant.mixture={mixture}"]
    command += ["--out", str(out / "proxy_at_full" / str(t["number"]))]
    return subprocess.run(command, stdout=subprocess.DEVNULL).returncode


with ThreadPoolExecutor(2) as pool:
    codes = list(pool.map(run, trials.iter_rows(named=True)))
sys.exit(max(codes, default=0))
PY
echo "proxy at the held-out mixtures: $(($(date +%s) - start)) s" | tee -a "$out/times.txt"

: > "$out/transfer.txt"
for metric in eval_loss greedy; do
  "$py" bench/proxy_transfer.py --proxy "$out/proxy" --full "$out/sweep" --proxy-at-full "$out/proxy_at_full" \
    --metric "$metric" --out "$out/transfer" | tee -a "$out/transfer.txt"
  table="$out/transfer/transfer_$metric.csv"
  # every target with a value in every row (a greedy rate stuck at 0 everywhere has nothing to rank)
  targets=$("$py" -c "import polars as pl, sys; t = pl.read_csv(sys.argv[1]); print(','.join(c for c in t.columns
if '/' in c and t[c].null_count() == 0 and t[c].n_unique() > 1))" "$table")
  if [ "$metric" = greedy ]; then direction=maximize; kind=--proportion; else direction=minimize; kind=; fi
  harness mixture --table "$table" --weights 'w_*' --objective "mean($targets)" --direction "$direction" $kind \
    --holdout-column held_out --out "$out/transfer/proposal_$metric.json" | tee -a "$out/transfer.txt"
done
