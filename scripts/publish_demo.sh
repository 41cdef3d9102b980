#!/usr/bin/env bash
# Build the demo bundle models/demo-bundle/ from the shared news-headlines training users.
# Resumable: re-running the same command reuses finished stages from models/demo-bundle/.work/.
# Usage: scripts/publish_demo.sh [extra publish options]   (run from the repository root)
set -euo pipefail
cd "$(dirname "$0")/.."
CORPUS="${CORPUS:-../shared/data/news-headlines/train.jsonl}"
OUT="${OUT:-models/demo-bundle}"
mkdir -p "$OUT/.work"
export PYTHONPATH="${PYTHONPATH:-.}"
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
python -c "from localpers.cli import app; app()" publish "$CORPUS" --out "$OUT" \
  --k 3 --history-examples 5 --global-epochs 0.54 --cluster-epochs 0.3 --cluster-init global \
  --rank 16 --lora-alpha 32 --dropout 0.05 --lr 2e-4 --batch-size 8 \
  --pairs-per-user 20 --head-steps 200 --head-d 128 \
  --threads 2 --engine-threads 1 --seed 0 \
  --data-source "HuffPost News Category Dataset v3 (Rishabh Misra, 2022), first 10k rows" \
  --data-licence "CC BY 4.0" "$@"
