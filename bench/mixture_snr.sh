#!/usr/bin/env bash
# The SNR table of the shipped six-task sweep (issue 52, item 1): the quickstart's assistant-stage simplex swept by a
# space-filling design, with a loss pool of LOSS_ITEMS items per task and held-out split, against a seed group of the
# quickstart's own mixture — then `harness mixture --snr` (docs/sweeps.md, "Signal to noise").
#
#   bench/mixture_snr.sh [OUT]          # OUT defaults to runs/snr; TRIALS, SEEDS, LOSS_ITEMS, SAMPLER override
#
# The experiment is experiments/quickstart.yaml with eval.loss_items added (written into OUT, so nothing shipped is
# duplicated); the sweep is experiments/sweeps/yesno_vs_qa.yaml's space and objective with the sampler swapped for
# a space-filling one. Trials and replicates run one torch thread each, two at a time.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-runs/snr}
trials=${TRIALS:-12}
seeds=${SEEDS:-0,1,2,3,4}
loss_items=${LOSS_ITEMS:-400}
sampler=${SAMPLER:-sobol}
py=${PYTHON:-python}
mkdir -p "$out"
export OMP_NUM_THREADS=1

"$py" - "$out" "$loss_items" "$trials" "$sampler" <<'EOF'
import sys
from pathlib import Path

import yaml

out, loss_items, trials, sampler = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
experiment = yaml.safe_load(Path("experiments/quickstart.yaml").read_text())
experiment["eval"]["loss_items"] = loss_items
(out / "quickstart_loss.yaml").write_text(yaml.safe_dump(experiment, sort_keys=False))
sweep = yaml.safe_load(Path("experiments/sweeps/yesno_vs_qa.yaml").read_text())
sweep["experiment"] = "quickstart_loss.yaml"
sweep["study"].update(name="yesno_vs_qa_snr", sampler=sampler, n_trials=trials)
sweep["study"].pop("enqueue", None)
(out / "sweep.yaml").write_text(yaml.safe_dump(sweep, sort_keys=False))
EOF

start=$(date +%s)
harness sweep "$out/sweep.yaml" --workers 2 --out "$out/sweep"
echo "sweep: $(($(date +%s) - start)) s" | tee "$out/times.txt"
start=$(date +%s)
harness run "$out/quickstart_loss.yaml" --seeds "$seeds" --jobs 2 --out "$out/group"
echo "seed group: $(($(date +%s) - start)) s" | tee -a "$out/times.txt"
harness mixture "$out/sweep" --snr "$out/group" | tee "$out/snr.txt"
