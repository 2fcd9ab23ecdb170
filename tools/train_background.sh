#!/usr/bin/env bash
# Training that outlives one GPU job: start tools/train.py detached (setsid) on the GPU machine,
# report on it, and copy its checkpoints out, so that several short GPU jobs train one run.
#
#   tools/train_background.sh start WORK -- TRAIN_ARGS...   # (re)start: stops a running one (it
#                                                             # checkpoints on SIGTERM) and resumes
#                                                             # from WORK/state (optimiser included)
#   tools/train_background.sh wait WORK SECONDS             # sleep, printing progress every minute
#   tools/train_background.sh collect WORK DEST             # copy compact checkpoints + log to DEST
#   tools/train_background.sh stop WORK                     # checkpoint and stop
#
# WORK holds out/ (compact fp16 checkpoints, train_log*.csv), state/ (full checkpoints), train.log
# and train.pid.  Under torchrun set TRAIN_LAUNCH, e.g. TRAIN_LAUNCH="torchrun --nproc-per-node 4".
# TRAIN_SCRIPT=train_residual.py trains the residual prior instead (its checkpoint, optimiser included,
# and its log in out/).  A GPU machine that is given back ends the run: end every job's command with
# `collect`, so the checkpoints written so far travel back with it.
set -euo pipefail
cmd=$1 work=$2; shift 2
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$work/out" "$work/state"
running() { [[ -f $work/train.pid ]] && kill -0 "$(cat "$work/train.pid")" 2>/dev/null; }
stop() {
  if running; then
    kill -TERM -- "-$(cat "$work/train.pid")" 2>/dev/null || kill -TERM "$(cat "$work/train.pid")"
    for _ in $(seq 120); do running || break; sleep 1; done
  fi
}
case $cmd in
  start)
    [[ ${1:-} == -- ]] && shift
    stop
    # shellcheck disable=SC2086
    script=${TRAIN_SCRIPT:-train.py} state=()
    [[ $script == train.py ]] && state=(--state-dir "$work/state")
    setsid ${TRAIN_LAUNCH:-python3} "$here/$script" --out "$work/out" "${state[@]}" \
      --resume "$work/out" "$@" >>"$work/train.log" 2>&1 < /dev/null &
    echo $! > "$work/train.pid"
    echo "started pid $(cat "$work/train.pid")";;
  wait)
    end=$((SECONDS + $1))
    while (( SECONDS < end )) && running; do
      sleep $(( end - SECONDS < 60 ? end - SECONDS : 60 ))
      tail -n 1 "$work/train.log"
    done
    running || { echo "training is not running"; tail -n 20 "$work/train.log"; };;
  collect)
    mkdir -p "$1"
    for f in "$work"/out/*.safetensors "$work"/out/*.csv; do  # '@' (an ablation's tag) becomes '_'
      [[ -f $f ]] && b=$(basename "$f") && cp "$f" "$1/${b//@/_}"
    done
    tail -n 30 "$work/train.log" > "$1/train_tail.log"
    ls -la "$1";;
  stop) stop; tail -n 5 "$work/train.log";;
  *) echo "unknown command $cmd" >&2; exit 2;;
esac
