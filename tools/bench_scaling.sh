#!/usr/bin/env bash
# Multi-GPU scaling on one host, every run against its baseline in the same run:
#   - folder compression under torchrun on N GPUs against one GPU (visemz.benchmarks.pipeline --torchrun);
#   - compressed all_reduce (ring, recursive doubling, auto), all_to_all and scatter against NCCL's own,
#     over NVLink and over NCCL's TCP sockets on loopback (a stand-in for an inter-node link);
#   - the image-stacking job on all GPUs (PSNR against the exact stack, speedup over plain all_reduce).
#
#   bash tools/bench_scaling.sh DATA OUT [N ...]     # DATA: e.g. DATA/eval (kodak/, xray/); N: GPU counts
#                                                      # (default 2, 4, 8 up to the host's GPU count)
# Each run has a time limit (SCALING_TIMEOUT seconds, default 300) so a hung rank costs one run, not all;
# JSON reports and logs go to OUT.  NVLink multicast stays off (NCCL_NVLS_ENABLE=0).
# SCALING_PARTS picks the parts (default "pipeline nvlink socket stack"); SCALING_SIZES (MiB, default
# 1,16,256), SCALING_EBS (default 1e-2,1e-4) and SCALING_KINDS (image, smooth; default image) set the
# collectives' ladder; SCALING_PREDICTORS (default none,lorenzo: the error-bounded codec without and with
# 1-D Lorenzo prediction) and SCALING_API (default functional,plan: all_reduce per call or through a
# persistent plan) add those axes to the all_reduce rows; SCALING_REPS sets the timed repetitions per
# row (default: visemz.benchmarks.collectives' 5).
set -uo pipefail
data=${1:?DATA folder (with kodak/ and xray/)}
out=${2:?OUT folder}
shift 2
limit=${SCALING_TIMEOUT:-300}
parts=" ${SCALING_PARTS:-pipeline nvlink socket stack} "
sizes=${SCALING_SIZES:-1,16,256}
ebs=${SCALING_EBS:-1e-2,1e-4}
kinds=${SCALING_KINDS:-image}
predictors=${SCALING_PREDICTORS:-none,lorenzo}
api=${SCALING_API:-functional,plan}
reps=${SCALING_REPS:+--reps $SCALING_REPS}
mkdir -p "$out"
here=$(cd "$(dirname "$0")" && pwd)
gpus=$(python3 -c "import torch; print(torch.cuda.device_count())")
counts=${*:-$(for n in 2 4 8; do [ "$n" -le "$gpus" ] && echo "$n"; done)}
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
SOCKET="NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_NET=Socket NCCL_SOCKET_IFNAME=lo"

run() {  # run NAME COMMAND...: log to OUT/NAME.log, report a failure and go on
  local name=$1; shift
  echo "== $name: $*"
  timeout "$limit" env "$@" > "$out/$name.log" 2>&1 || echo "!! $name failed or timed out (exit $?), see $out/$name.log"
  grep -v -i warn "$out/$name.log" | tail -n 4
}

has() { [[ $parts == *" $1 "* ]]; }

for n in $counts; do
  has pipeline && run "pipeline_${n}gpu" torchrun --nproc-per-node "$n" -m visemz.benchmarks.pipeline --torchrun --data "$data" \
    --repeat-to 1000 --streams 4 --repeat 2 --work "$out/work_${n}gpu" --out "$out/pipeline_${n}gpu.json"
  rm -rf "$out/work_${n}gpu"
  for link in nvlink socket; do
    has "$link" || continue
    env_vars=""; [ "$link" = socket ] && env_vars=$SOCKET
    # shellcheck disable=SC2086  # env_vars is a list of NAME=VALUE words
    run "collectives_${link}_${n}gpu" $env_vars torchrun --nproc-per-node "$n" -m visemz.benchmarks.collectives \
      --data "$data/xray" --label "$link-$n" --out "$out/collectives_${link}_${n}gpu.json" \
      --ops all_reduce,all_to_all,scatter --sizes-mb "$sizes" --ebs "$ebs" --kinds "$kinds" \
      --predictors "$predictors" --api "$api" --skip-codecs $reps
  done
done
has stack || exit 0
# An exposure stack: 32 frames of the first X-ray with Poisson noise (same scene, same shape), float32 TIFF.
python3 "$here/make_exposure_stack.py" "$data/xray" "$out/frames" --frames 32
n_max=$(echo "$counts" | tr ' ' '\n' | sort -n | tail -n 1)
run "stack_${n_max}gpu" torchrun --nproc-per-node "$n_max" -m visemz stack "$out/frames" --out "$out/stacked.tiff" \
  --error-bound 1e-4 --device cuda
rm -rf "$out/frames"
