#!/usr/bin/env bash
# The checks that need a CUDA GPU (CI has none), in one short run (about 5 minutes on one H100):
#   1. tests/test_cuda.py: every method and method + transform on the device (reproducible bit for bit there,
#      equal to the CPU within float reassociation, states kept on the device, resume and vmap there), and two
#      convolutional models through cuDNN;
#   2. a real MNIST run (T3's FedALA config, 3 rounds) twice on the GPU and once on the CPU, beside step 1:
#      the two GPU histories must be identical, and the GPU-vs-CPU differences are printed;
#   3. `fedblend bench` of the same config on the GPU and on the CPU (engine vs plain loop on each device;
#      BENCH_DEVICES="cuda" for the GPU alone).
# Usage: bash bookkeeping/gpu_check.sh OUTDIR   (FEDBLEND_DATA must hold mnist/; PYTHON defaults to python3)
set -uo pipefail
out=${1:?usage: bookkeeping/gpu_check.sh OUTDIR}
mkdir -p "$out"
py=${PYTHON:-python3}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
cfg=configs/benchmarks/t3-mnist-pat-fedala.toml
runs=$(mktemp -d)
fail=0

nvidia-smi -L
$py -c "import torch; print('torch', torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0))"

real() {  # real NAME DEVICE THREADS
    $py -m fedblend.cli.main run "$cfg" --set rounds=3 --device "$2" --threads "$3" --quiet --out "$runs/$1" \
        > "$runs/$1.log" 2>&1 || { echo "real run $1 failed:"; tail -20 "$runs/$1.log"; }
}
(real cuda-a cuda 1 & real cuda-b cuda 1 & real cpu cpu 8 & wait) &
real_pid=$!

$py -m pytest -q -p no:cacheprovider --tb=short -rf tests/test_cuda.py 2>&1 | tee "$out/pytest-cuda.log" | tail -25
[ "${PIPESTATUS[0]}" -eq 0 ] || fail=1

wait $real_pid
$py - "$runs" <<'EOF' 2>&1 | tee "$out/real-mnist.txt" || fail=1
import json, sys
from pathlib import Path
runs = Path(sys.argv[1])
def hist(name):
    rows = [json.loads(x) for x in (runs / name / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if "seconds" not in k and not k.endswith("_share")} for r in rows]
a, b, c = hist("cuda-a"), hist("cuda-b"), hist("cpu")
print("T3 FedALA, MNIST, 3 rounds; device of each run:",
      [json.loads((runs / n / "summary.json").read_text())["run"]["device"] for n in ("cuda-a", "cuda-b", "cpu")])
for r_a, r_c in zip(a, c):
    print(f"round {r_a['round']}: acc cuda {r_a['acc']:.6f} cpu {r_c['acc']:.6f} (diff {r_a['acc'] - r_c['acc']:+.2e}); "
          f"train_loss cuda {r_a['train_loss']:.6f} cpu {r_c['train_loss']:.6f}")
print("two GPU runs identical:", a == b)
sys.exit(0 if a == b else 1)
EOF

for dev in ${BENCH_DEVICES:-cuda cpu}; do
    $py -m fedblend.cli.main bench "$cfg" --rounds 2 --device $dev --threads 16 2>&1 | tee "$out/bench-$dev.txt" | tail -12
done
echo "gpu_check: $([ $fail -eq 0 ] && echo PASSED || echo FAILED)"
exit $fail
