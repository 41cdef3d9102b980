#!/usr/bin/env bash
# Stage times of a shrunken publish (few SFT steps, 1 pair per author) under several executors, for
# docs/PUBLISHING.md. Every run writes OUTROOT/<name>/result.json (the `--json` result) and
# OUTROOT/<name>/load.txt (uptime before and after: the machine's load is part of every figure).
# Usage: scripts/publish_scaling.sh OUTROOT NAME CORPUS K EXECUTOR [WORKERS]   (from the repository root)
#   e.g. scripts/publish_scaling.sh /tmp/scaling ray-w2 ../shared/data/news-headlines/train.jsonl 4 ray 2
set -euo pipefail
cd "$(dirname "$0")/.."
OUTROOT="$1"; NAME="$2"; CORPUS="$3"; K="$4"; EXECUTOR="$5"; WORKERS="${6:-}"
OUT="$OUTROOT/$NAME"
mkdir -p "$OUT"
export PYTHONPATH="${PYTHONPATH:-.}"
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
uptime > "$OUT/load.txt"
python -c "from localpers.cli import app; app()" publish "$CORPUS" --out "$OUT/bundle" --json \
  --k "$K" --max-steps 4 --batch-size 4 --precision fp32 --val-fraction 0.01 \
  --rank 8 --lora-alpha 16 --pairs-per-user 1 --head-steps 30 --head-d 32 \
  --threads 1 --engine-threads 1 --shard-users 8 --seed 0 \
  --executor "$EXECUTOR" ${WORKERS:+--workers "$WORKERS"} > "$OUT/result.json" 2> "$OUT/stderr.log"
uptime >> "$OUT/load.txt"
python -c "import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[2], r['stage_seconds'])" \
  "$OUT/result.json" "$NAME"
