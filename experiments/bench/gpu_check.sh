#!/usr/bin/env bash
# The GPU checks in one command, for a lent GPU machine (docs/simulation.md, "The paper's CIFAR-10 shape";
# docs/regime.md, "Participation on the map"). PHASES picks what runs, in this order:
#   paired  the paper's CIFAR-10 shape, client-batching 100: the plain loop and Flower with merged uploads
#           (PAIRED_ROUNDS rounds each), then Flower with one reply record per client (SINGLE_ROUNDS);
#   clients the same through Flower with 1,000 and then 10,000 registered clients (CLIENT_ROUNDS rounds):
#           rounds a second and the process tree's memory;
#   cell    ResNet-9 on MNIST's test split at the paper's sketch (experiments/configs/participation_resnet9.toml),
#           seeds SEEDS: about one participation (P1_ROUNDS) for each method of CELL_STRATEGIES in turn, then
#           local top-k at FetchSGD's upload (k = MATCHED_K); beside it, about ten (P10_ROUNDS), each method in a
#           process of its own, all at once;
#   tests   the suite's GPU tests;
#   mutants the CUDA-only mutants (tests/tools/cuda_mutants.py) against those tests, in the copy that
#           `python -m tests.tools.cuda_mutants prepare mutants-work/cuda` made beforehand (carry mutants-work/cuda);
#           outcomes in OUT/cuda-mutants.json, for `mutation_report --cuda`.
# Every figure and log goes to OUT (default /tmp/gpu-check); the runs' metrics to OUT/runs.tar.gz.
# Where flwr is not installed, wheels in .device/whl are installed first (the machine has no network);
# MNIST's files are read from .device/mnist, or from ../shared/data/mnist.
#   PHASES="paired clients cell" bash experiments/bench/gpu_check.sh
# Rehearse it on a CPU first: EXTRA=--small PAIRED_ROUNDS=3 SINGLE_ROUNDS=2 CLIENT_ROUNDS=2 P1_ROUNDS=2 P10_ROUNDS=2
#   MATCHED_K=100 CELL_SET="--set model=mlp --set model-hidden=16 --set sketch-cols=400 --set k=50 --set device=cpu"
set -u -o pipefail
OUT=${OUT:-/tmp/gpu-check}
PHASES=${PHASES:-paired clients cell}
PAIRED_ROUNDS=${PAIRED_ROUNDS:-30}
SINGLE_ROUNDS=${SINGLE_ROUNDS:-20}
CLIENT_ROUNDS=${CLIENT_ROUNDS:-12}
SEEDS=${SEEDS:-1}
CELL_STRATEGIES=${CELL_STRATEGIES:-fetchsgd,local_topk,true_topk,fedavg}
MATCHED_K=${MATCHED_K:-2294000}  # local top-k's bitmask encoding of k values: FetchSGD's 10.0 MB upload
CELL_SET=${CELL_SET:-}
P1_ROUNDS=${P1_ROUNDS:-16}
P10_ROUNDS=${P10_ROUNDS:-160}
EXTRA=${EXTRA:-}  # e.g. --small, to rehearse the script on a CPU
RUNS=${RUNS:-/tmp/paper-runs}
mkdir -p "$OUT" "$RUNS"
if [ -d .device/whl ] && ! python3 -c "import flwr" 2>/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .device/whl/*.whl || exit 3
    export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
fi
# Flower's simulation refuses to start unless a module named ray can be found (run_simulation.py, 1.42), though
# the in-process backend never imports it. Where Ray is absent, an empty package stands in (any use fails loudly).
if ! python3 -c "import ray" 2>/dev/null; then
    mkdir -p /tmp/noray/ray && echo '"""Stands in for Ray where it is absent."""' >/tmp/noray/ray/__init__.py
    export PYTHONPATH=/tmp/noray${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
MNIST=$PWD/.device/mnist
[ -d "$MNIST" ] || MNIST=$(cd .. && pwd)/shared/data/mnist
{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    echo "cores $(nproc)"
    python3 -c "import sys, torch, flwr; print(sys.version.split()[0], torch.__version__, flwr.__version__, torch.cuda.is_available())"
} 2>&1 | tee "$OUT/env.txt" || exit 4

has() { case " $PHASES " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
paper() { timeout -k 15 "$1" python3 -m experiments.bench.bench_paper --batching 100 $EXTRA "${@:2}"; }

if has paired; then
    paper 200 --rounds "$PAIRED_ROUNDS" --keep "$RUNS/paired" 2>&1 | tee "$OUT/paired.log"
    paper 120 --rounds "$SINGLE_ROUNDS" --no-loop --no-merge --keep "$RUNS/single" 2>&1 | tee "$OUT/single.log"
fi
if has clients; then
    for n in 1000 10000; do
        paper 150 --rounds "$CLIENT_ROUNDS" --no-loop --clients "$n" --keep "$RUNS/clients-$n" 2>&1 | tee "$OUT/clients-$n.log"
    done
fi
if has cell; then
    mkdir -p "$RUNS/cell/logs"
    cell() {  # one participation cell: experiment name, rounds, evaluation cadence, fedsketch run's other arguments
        OMP_NUM_THREADS=${CELL_THREADS:-3} timeout -k 20 "${CELL_BUDGET:-420}" python3 -m experiments.cli run experiments/configs/participation_resnet9.toml --no-plan --no-plot \
            --seeds "$SEEDS" --out "$RUNS/cell" --set "data-root=$MNIST" --set "experiment=$1" \
            --set "num-rounds=$2" --set "eval-every=$3" $CELL_SET "${@:4}"
    }
    sed -i 's/^local-topk-error = \["client", "none"\]/local-topk-error = ["none"]/' experiments/configs/participation_resnet9.toml
    start=$SECONDS
    (for s in ${CELL_STRATEGIES//,/ }; do cell participation-resnet9-p1 "$P1_ROUNDS" 2 --strategies "$s" || exit 1; done &&
        cell participation-resnet9-p1-matched "$P1_ROUNDS" 2 --strategies local_topk --set "k=$MATCHED_K") \
        >"$RUNS/cell/logs/p1.log" 2>&1 &
    pids="$!"
    for s in ${CELL_STRATEGIES//,/ }; do  # about ten participations: each method in a process of its own, side by side
        cell participation-resnet9-p10 "$P10_ROUNDS" 10 --strategies "$s" >"$RUNS/cell/logs/p10-$s.log" 2>&1 &
        pids="$pids $!"
    done
    for pid in $pids; do wait "$pid"; echo "$pid: exit $? after $((SECONDS - start)) s" | tee -a "$OUT/cell.txt"; done
    git checkout -q experiments/configs/participation_resnet9.toml 2>/dev/null
    tail -n 3 "$RUNS"/cell/logs/*.log | tee -a "$OUT/cell.txt"
    (cd "$RUNS/cell" && tar czf "$OUT/runs.tar.gz" --exclude=client-state --exclude=flwr-home --exclude='*.npz' .)
    python3 -m experiments.studies.participation "$RUNS/cell" --out "$OUT" 2>&1 | tee -a "$OUT/cell.txt"
fi
if has tests; then
    # only the files that hold GPU tests: the others may import what the machine lacks (datasets, mlflow)
    timeout -k 5 90 python3 -m pytest -q -p no:cacheprovider -rs -m gpu $(grep -rl "mark.gpu" tests --include="test_*.py") \
        2>&1 | tail -25 | tee "$OUT/gpu_tests.log"
fi
if has mutants; then
    (cd mutants-work/cuda/tree && PYTHONPATH=../site:$PYTHONPATH timeout -k 10 "${MUTANTS_BUDGET:-420}" \
        python3 -m tests.tools.cuda_mutants check --limit 60 --out "$OUT/cuda-mutants.json" -- -rs -m gpu \
        $(grep -rl "mark.gpu" tests --include="test_*.py")) 2>&1 | tail -40 | tee "$OUT/cuda_mutants.log"
fi
grep -h -A12 "^| run " "$OUT"/paired.log "$OUT"/single.log "$OUT"/clients-*.log 2>/dev/null | grep "^|" | tee "$OUT/summary.txt"
