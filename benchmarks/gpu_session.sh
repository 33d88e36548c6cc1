#!/usr/bin/env bash
# What issue 21 still needs from a GPU, in pieces that each fit a 10-minute job, logs and JSON under one folder.
#
#   bash benchmarks/gpu_session.sh OUT STEP...      STEP: test, inversion, measure, training, study (or all)
#
# Estimated H100 times (from the issue's and earlier runs' numbers): test ~8 min (the H100 run of 543 tests took 224 s;
# the suite has about twice as many now), inversion ~4 min, measure ~5 min, training ~4 min, study (early stopping at
# the paper workload: one unstopped run logging every step) ~3 min; where each job has a 10-minute limit, run each step
# as a job of its own. OUT=benchmarks/results puts the JSON where the README's tables cite it.
# Uses `python3` with the project on PYTHONPATH (no virtual environment: a machine that cannot reach PyPI runs the
# interpreter that already holds torch). Besides torch, torchvision, numpy, scipy, scikit-learn, scikit-image, pandas,
# matplotlib, pillow, jinja2, tqdm, safetensors and pytest, it needs hydra-core, omegaconf, antlr4-python3-runtime,
# kornia, kornia_rs, lpips, markdown-it-py with mdurl, PyYAML and packaging and, for the anchors, robustness with cox,
# dill, tensorboardX and protobuf (carry them as wheels where they are missing: pip install --no-deps --target DIR *.whl,
# then PYTHONPATH=DIR). CIFAR-10 comes from $CIFAR_ROOT (a folder holding cifar-10-batches-py/; default
# ../shared/data/cifar-10-mini, which a copy of the checkout alone does not hold: copy it into an ignored folder of the
# checkout and set CIFAR_ROOT); the inversion and measure steps refuse to start without it.
set -uo pipefail
usage="usage: bash benchmarks/gpu_session.sh OUT STEP... (STEP: test, inversion, measure, training, study, all)"
if [ $# -lt 2 ]; then
    echo "$usage" >&2
    exit 2
fi
out=$(realpath -m "$1"); shift  # from the caller's folder, before the cd
for step in "$@"; do
    case $step in test|inversion|measure|training|study|all) ;; *) echo "unknown step '$step'; $usage" >&2; exit 2 ;; esac
done
steps=" $* "
case $steps in *" all "*) steps=" test inversion measure training study " ;; esac
cifar=$(realpath -m "${CIFAR_ROOT:-$(dirname "$0")/../../shared/data/cifar-10-mini}")
case $steps in *" inversion "*|*" measure "*|*" study "*)
    if [ ! -d "$cifar/cifar-10-batches-py" ]; then  # else the inversion targets are random images and measure cannot run
        echo "no CIFAR-10 at $cifar (cifar-10-batches-py/ missing): set CIFAR_ROOT to a folder that holds it" >&2
        exit 2
    fi ;;
esac
cd "$(dirname "$0")/.."
if ! slug=$(python3 -c "import torch, re; print(re.sub(r'[^a-z0-9]+', '-', torch.cuda.get_device_name().lower()).strip('-'))" 2>/dev/null); then
    echo "python3 sees no CUDA device (or no torch): this script measures a GPU; run it on a GPU machine" >&2
    exit 2
fi
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
status=0

run() {  # run NAME COMMAND...: the command's output to the terminal and to $out/NAME.log; a failure is remembered
    local name=$1; shift
    echo "== $name: $*"
    "$@" 2>&1 | tee "$out/$name.log" || status=1
}

case $steps in *" test "*)
    run test-gpu env REPALIGN_TEST_DEVICE=cuda python3 -m pytest -q -rs ;;
esac
case $steps in *" inversion "*)
    # The goal's runs at full length; the anchor ratio at 1000 steps (its time per step is constant).
    run inversion-5000 python3 benchmarks/bench_inversion.py --items 200 --steps 5000 --skip anchor engine --cuda-graph true \
        --data-root "$cifar" --out "$out/inversion_5000_$slug.json"
    run inversion-1000 python3 benchmarks/bench_inversion.py --items 200 --steps 1000 --skip engine-best-stop --cuda-graph true \
        --data-root "$cifar" --out "$out/inversion_1000_$slug.json" ;;
esac
case $steps in *" measure "*)
    run measure-best python3 benchmarks/bench_measure.py --engine best --data-root "$cifar" --out "$out/measure_paper_best_$slug.json"
    run measure-paper python3 benchmarks/bench_measure.py --engine paper --data-root "$cifar" --out "$out/measure_paper_paper_$slug.json" ;;
esac
case $steps in *" training "*)
    run training python3 benchmarks/bench_training.py --images 10000 --batch-size 128 --modes pgd --workers 8 --cuda-graph \
        --out "$out/training_$slug.json" ;;
esac
case $steps in *" study "*)
    run study python3 benchmarks/early_stopping_study.py --arch resnet18 --items 200 --steps 5000 --precision auto \
        --data-root "$cifar" --out "$out/early_stopping_$slug.json" ;;
esac
exit $status
