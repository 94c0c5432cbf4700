#!/usr/bin/env bash
# The GPU checks in one command, for a lent GPU machine (docs/simulation.md, "The paper's CIFAR-10 shape"):
#   1. FetchSGD's CIFAR-10 shape through Flower, client-batching 100, ROUNDS rounds (default the paper's 2,400),
#      cut at BUDGET seconds; rounds.jsonl stamps each round's end, so a cut run still says how far it got;
#   2. the suite's GPU tests (pytest -m gpu; TEST_BUDGET=0 leaves them out);
#   3. with LOOP_ROUNDS > 0, the plain loop (bench_sim.plain_loop: no Flower, no billing), client-batching 100;
#   4. Flower with one client at a time, for SINGLE_ROUNDS rounds (0 leaves it out): what batching buys;
#   5. with ONE_NODE_ROUNDS > 0, Flower with client-batching 100 on one simulated node (one cohort a round).
# NODES sets the simulated nodes of run 1 (default 2). With PROFILE=1 and py-spy on the PATH, run 1 runs under
# py-spy (every thread of every process, 40 samples a second) into $OUT/profile_batched.txt, and
# experiments/bench/profile_split.py prints where its time went.
# Where flwr is not installed, wheels saved in .whl/ are installed first (the machine has no network).
#   bash experiments/bench/gpu_check.sh            # OUT=folder for the logs (default /tmp/gpu-check)
set -u -o pipefail
OUT=${OUT:-/tmp/gpu-check}
ROUNDS=${ROUNDS:-2400}
BUDGET=${BUDGET:-450}
SINGLE_ROUNDS=${SINGLE_ROUNDS:-20}
NODES=${NODES:-2}
RUNS=${RUNS:-/tmp/paper-runs}
EXTRA=${EXTRA:-}  # e.g. --small, to rehearse the script on a CPU
mkdir -p "$OUT"
if [ -d .whl ] && ! python3 -c "import flwr" 2>/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
    export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
fi
# Flower's simulation refuses to start unless a module named ray can be found (run_simulation.py, 1.42), though
# the in-process backend never imports it. Where Ray is absent (its wheel is larger than a lent machine can be
# sent), an empty package stands in; any use of Ray would then fail loudly.
if ! python3 -c "import ray" 2>/dev/null; then
    mkdir -p /tmp/noray/ray && echo '"""Stands in for Ray where it is absent; see experiments/bench/gpu_check.sh."""' >/tmp/noray/ray/__init__.py
    export PYTHONPATH=/tmp/noray${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    nproc
    python3 -c "import sys, torch, flwr; print(sys.version.split()[0], torch.__version__, flwr.__version__, torch.cuda.is_available())"
} 2>&1 | tee "$OUT/env.txt" || exit 4

summary() {  # rounds done, mean seconds a round over rounds 2..n, and 2,400 rounds projected
    python3 - "$1" "$2" <<'EOF'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
ends = [float(r["unix_time"]) for r in rows]
gaps = [b - a for a, b in zip(ends, ends[1:])]
mean = statistics.fmean(gaps) if gaps else float("nan")
last = {k: v for k, v in rows[-1].items() if k in ("round", "test_accuracy", "test_loss", "bytes_up", "bytes_down")}
print(f"{sys.argv[2]}: {len(rows)} rounds stamped, mean {mean:.4f} s a round over rounds 2..{len(rows)} "
      f"(median {statistics.median(gaps) if gaps else float('nan'):.4f} s), rounds 2..{len(rows)} took {ends[-1] - ends[0]:.1f} s; "
      f"2,400 rounds at that mean: {2399 * mean / 60:.1f} min after round 1; last row {last}")
if len(gaps) >= 20:
    print(f"  mean of rounds 2-11: {statistics.fmean(gaps[:10]):.3f} s, of the last 10: {statistics.fmean(gaps[-10:]):.3f} s")
EOF
}

stop_flower() { pkill -f flower-superlink; pkill -f flwr-simulation; sleep 1; }

nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader,nounits -l 2 >"$OUT/gpu_samples.txt" 2>/dev/null &
sampler=$!
profiler=()
if [ "${PROFILE:-0}" = 1 ] && command -v py-spy >/dev/null; then
    profiler=(py-spy record -s -r 40 -f raw -o "$OUT/profile_batched.txt" --)
fi
start=$SECONDS
# SIGINT first: py-spy writes what it sampled when interrupted
timeout -s INT -k 20 "$BUDGET" "${profiler[@]}" python3 -m experiments.bench.bench_paper --rounds "$ROUNDS" --batching 100 \
    --no-loop --supernodes "$NODES" $EXTRA --keep "$RUNS/batched" 2>&1 | tee "$OUT/paper_batched.log"
echo "batched run: exit ${PIPESTATUS[0]} after $((SECONDS - start)) s" | tee -a "$OUT/paper_batched.log"
stop_flower
log=$(find "$RUNS/batched" -name rounds.jsonl | head -1)
[ -n "$log" ] && cp "$log" "$OUT/rounds_batched.jsonl" && summary "$log" "client-batching 100" | tee "$OUT/summary.txt"
flog=$(find "$RUNS/batched" -name flower.log | head -1)
[ -n "$flog" ] && { echo "--- flower.log: fallbacks $(grep -c 'vectorized call failed' "$flog"), last lines:"; tail -25 "$flog"; } >>"$OUT/paper_batched.log"
metrics=$(find "$RUNS/batched" -name metrics.jsonl | head -1)
[ -n "$metrics" ] && cp "$metrics" "$OUT/metrics_batched.jsonl"
[ -s "$OUT/profile_batched.txt" ] && python3 -m experiments.bench.profile_split "$OUT/profile_batched.txt" | tee "$OUT/profile_split.txt"

if [ "${ONE_NODE_ROUNDS:-0}" -gt 0 ]; then  # one cohort of 100 a round: what a second node's thread costs or buys
    timeout -k 15 "${ONE_NODE_BUDGET:-90}" python3 -m experiments.bench.bench_paper --rounds "$ONE_NODE_ROUNDS" \
        --batching 100 --no-loop --supernodes 1 $EXTRA --keep "$RUNS/one-node" 2>&1 | tail -4 | tee "$OUT/paper_one_node.log"
    stop_flower
    log=$(find "$RUNS/one-node" -name rounds.jsonl | head -1)
    [ -n "$log" ] && summary "$log" "client-batching 100, one node" | tee -a "$OUT/summary.txt"
fi

[ "${TEST_BUDGET:-45}" -gt 0 ] && timeout -k 5 "${TEST_BUDGET:-45}" python3 -m pytest -q -p no:cacheprovider -m gpu tests --ignore=tests/test_data_femnist.py 2>&1 | tail -6 | tee "$OUT/gpu_tests.log"

if [ "${LOOP_ROUNDS:-0}" -gt 0 ]; then  # the plain loop (no Flower, no billing): what the clients and the server step cost
    timeout -k 15 "${LOOP_BUDGET:-60}" python3 -m experiments.bench.bench_paper --rounds "$LOOP_ROUNDS" --batching 100 \
        --no-flower $EXTRA 2>&1 | tail -4 | tee "$OUT/paper_loop.log"
    grep "^| loop" "$OUT/paper_loop.log" | sed 's/^/loop: /' >>"$OUT/summary.txt"
fi

[ "$SINGLE_ROUNDS" -gt 0 ] || { kill $sampler; cat "$OUT/summary.txt"; exit 0; }
start=$SECONDS
timeout -k 15 "${SINGLE_BUDGET:-90}" python3 -m experiments.bench.bench_paper --rounds "$SINGLE_ROUNDS" --batching 0 \
    --no-loop $EXTRA --keep "$RUNS/single" 2>&1 | tail -8 | tee "$OUT/paper_single.log"
echo "one-at-a-time run: exit ${PIPESTATUS[0]} after $((SECONDS - start)) s" | tee -a "$OUT/paper_single.log"
stop_flower
log=$(find "$RUNS/single" -name rounds.jsonl | head -1)
[ -n "$log" ] && summary "$log" "client-batching 0" | tee -a "$OUT/summary.txt"
kill $sampler 2>/dev/null
sort -n "$OUT/gpu_samples.txt" | tail -1 | sed 's/^/peak GPU memory in use (MiB), utilization (%): /' | tee -a "$OUT/summary.txt"
cat "$OUT/summary.txt"
