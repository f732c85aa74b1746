#!/usr/bin/env bash
# `mpirun -np N polyprobe train` end to end (docs/scale.md): the trajectory is bit-identical
# without mpirun and at 1, 2 and 3 ranks (oversubscribed), also in a rotating factored subspace;
# a rank killed mid-run ends the job within a bound, naming the rank, and its last checkpoint
# resumes on one rank to the very weights of an uninterrupted run; ranks that disagree or cannot
# start are refused at start-up with one message naming the rank and the difference; NCCL asked
# for where a rank cannot use it ends the job saying why; the balance clock and the ranks' waits
# are stated.
# usage: mpi_train_test.sh POLYPROBE MPIRUN
set -uo pipefail
polyprobe=$(realpath "$1")
mpirun=$2
work=$(mktemp -d)
[[ -n ${KEEP_WORK:-} ]] && echo "work: $work" || trap 'rm -rf "$work"' EXIT
cd "$work" || exit 1
# OpenMPI refuses root unless told; CI runs as root in a container.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
mpi=("$mpirun" --oversubscribe)
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# The metrics without the clock: step, epoch, loss, accuracy, candidates of every record.
trajectory() {
  python3 -c '
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    print(r["step"], r.get("epoch"), r.get("split", "train"), repr(r["loss"]), repr(r["accuracy"]), r.get("candidates"))
' "$1"
}

# 1. One trajectory for every rank count.
run=(train --epochs 2 --hidden 24 --threads 1 --quiet)
"$polyprobe" "${run[@]}" --metrics alone.jsonl --save alone.safetensors >alone.out 2>&1 ||
  fail "train without mpirun: $(cat alone.out)"
for n in 1 2 3; do
  timeout 120 "${mpi[@]}" -np $n "$polyprobe" "${run[@]}" --metrics r$n.jsonl --save r$n.safetensors \
    >r$n.out 2>&1 || { fail "mpirun -np $n train: $(cat r$n.out)"; continue; }
  cmp -s alone.safetensors r$n.safetensors || fail "weights at $n ranks differ from the run without mpirun"
  [[ $(trajectory alone.jsonl) == "$(trajectory r$n.jsonl)" ]] ||
    fail "the metrics at $n ranks differ from the run without mpirun"
  grep -q "test accuracy" r$n.out || fail "no test accuracy at $n ranks: $(cat r$n.out)"
  # Rank 0 alone prints: one copy of each line.
  [[ $(grep -c "test accuracy" r$n.out) == 1 ]] || fail "$n ranks printed the result more than once"
done
# The schedule on rank 0's clock: every rank asks for it before every step, so none waits
# forever, and the run the limit cuts still ends annealed.
timeout 120 "${mpi[@]}" -np 2 "$polyprobe" train --epochs 200 --hidden 24 --threads 1 --quiet \
  --schedule-clock time --time-limit 1 --metrics clock.jsonl >clock.out 2>&1 ||
  fail "mpirun -np 2 train --schedule-clock time: $(cat clock.out)"
grep -q "reached --time-limit" clock.out || fail "the timed 2-rank run did not reach its limit: $(cat clock.out)"
python3 -c '
import json, sys
eps = [json.loads(l)["epsilon"] for l in open(sys.argv[1]) if "epsilon" in l]
sys.exit(0 if eps and eps[-1] < 0.25 * eps[0] else 1)' clock.jsonl ||
  fail "the timed 2-rank run did not anneal by the clock"
grep -q "on each of 2 ranks" r2.out || fail "the 2-rank run does not say it is sharded: $(cat r2.out)"
grep -q "exchanges over mpi, why: the backend's losses are in host memory" r2.out ||
  fail "the 2-rank run does not say how its losses cross and why: $(cat r2.out)"
grep -q "slices balanced by \(wall\|CPU\) time: " r2.out ||
  fail "the 2-rank run does not say what its slices are balanced by: $(cat r2.out)"
grep -q "; waits \(poll (every rank has CPUs of its own)\|pause after 200 us (ranks share CPUs)\); " r2.out ||
  fail "the 2-rank run does not say how its ranks wait: $(cat r2.out)"
# Three one-thread ranks on fewer CPUs (unbound, as mpirun leaves oversubscribed ranks) share
# them: their wall times count each other, so auto balances by CPU time.
if ((3 > $(nproc))); then
  grep -q "slices balanced by CPU time: the 3 ranks on .* run 3 threads on $(nproc) CPUs" r3.out ||
    fail "3 oversubscribed ranks are not balanced by CPU time: $(cat r3.out)"
  grep -q "; waits pause after 200 us (ranks share CPUs); " r3.out ||
    fail "3 oversubscribed ranks do not pause in their waits: $(cat r3.out)"
fi
timeout 120 "${mpi[@]}" -np 3 "$polyprobe" "${run[@]}" --rank-balance wall --save w3.safetensors \
  >w3.out 2>&1 || fail "mpirun -np 3 train --rank-balance wall: $(cat w3.out)"
cmp -s alone.safetensors w3.safetensors || fail "weights with --rank-balance wall differ"
grep -q "slices balanced by wall time, as asked" w3.out ||
  fail "--rank-balance wall is not said: $(cat w3.out)"
timeout 120 "${mpi[@]}" -np 2 "$polyprobe" "${run[@]}" --rank-exchange mpi --rank-waits pause \
  --save m2.safetensors >m2.out 2>&1 || fail "mpirun -np 2 train --rank-exchange mpi: $(cat m2.out)"
cmp -s alone.safetensors m2.safetensors || fail "weights with --rank-exchange mpi differ"
grep -q "; waits pause after 200 us (as asked); " m2.out || fail "--rank-waits pause is not said: $(cat m2.out)"
# The same trajectory when every rank gathers all losses and finishes the whole step.
timeout 120 "${mpi[@]}" -np 2 "$polyprobe" "${run[@]}" --sharded-finish off --metrics g2.jsonl \
  --save g2.safetensors >g2.out 2>&1 || fail "mpirun -np 2 train --sharded-finish off: $(cat g2.out)"
cmp -s alone.safetensors g2.safetensors ||
  fail "weights at 2 ranks with the gathered finish differ from the run without mpirun"
grep -q "sharded finish off" g2.out || fail "the gathered run does not say so: $(cat g2.out)"
# In a subspace whose basis is redrawn every 3 steps (the moves and rotations go through the
# backend's subspace on every rank).
factored=("${run[@]}" --subspace factored --subspace-rank 2 --subspace-rotation-interval 3)
"$polyprobe" "${factored[@]}" --save f1.safetensors >f1.out 2>&1 ||
  fail "train --subspace factored without mpirun: $(cat f1.out)"
timeout 120 "${mpi[@]}" -np 2 "$polyprobe" "${factored[@]}" --save f2.safetensors >f2.out 2>&1 ||
  fail "mpirun -np 2 train --subspace factored: $(cat f2.out)"
cmp -s f1.safetensors f2.safetensors ||
  fail "weights at 2 ranks in a rotating factored subspace differ from the run without mpirun"

# 2. A rank killed mid-run ends the job (bounded), and the last checkpoint resumes on 1 rank.
long=(train --epochs 16 --hidden 64 --threads 1 --validate-every 4 --quiet)
"$polyprobe" "${long[@]}" --save whole.safetensors >whole.out 2>&1 || fail "uninterrupted run: $(cat whole.out)"
timeout 120 "${mpi[@]}" -np 2 "$polyprobe" "${long[@]}" --save cut.safetensors >cut.out 2>&1 &
launcher=$!
killed=""
for _ in $(seq 600); do
  if [[ -s cut.safetensors.ckpt ]]; then
    for pid in $(pgrep -P $launcher) $(pgrep -P "$(pgrep -P $launcher | head -1)" 2>/dev/null); do
      if tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx OMPI_COMM_WORLD_RANK=1; then
        kill -9 "$pid" && killed=$pid
        break
      fi
    done
    break
  fi
  sleep 0.05
done
wait $launcher
code=$?
if [[ -z $killed ]]; then
  fail "found no rank 1 to kill (or the run ended before its first checkpoint): $(cat cut.out)"
else
  ((code != 0 && code != 124)) || fail "killing rank 1 gave exit $code (124: the job hung)"
  grep -q "rank 1" cut.out || fail "the job's end does not name rank 1: $(cat cut.out)"
  "$polyprobe" "${long[@]}" --save cut.safetensors --resume >resumed.out 2>&1 ||
    fail "resuming the 2-rank checkpoint on 1 rank: $(cat resumed.out)"
  grep -q "resuming from step" resumed.out || fail "the resumed run did not resume: $(cat resumed.out)"
  cmp -s whole.safetensors cut.safetensors ||
    fail "the run resumed on 1 rank from the 2-rank checkpoint ends elsewhere than the uninterrupted one"
fi

# 3. Ranks that disagree are refused at start-up, naming the rank and the option.
timeout 60 "${mpi[@]}" -np 1 "$polyprobe" "${run[@]}" --seed 1 : -np 1 "$polyprobe" "${run[@]}" --seed 2 \
  >seed.out 2>&1 && fail "ranks with different seeds trained"
grep -q "rank 1: option --seed is '2', rank 0's is '1'" seed.out ||
  fail "the seed difference is not named: $(cat seed.out)"
printf 'a,b,label\n1,2,0\n3,4,1\n5,6,0\n7,8,1\n1,1,0\n2,2,1\n3,3,0\n4,4,1\n' >mine.csv
timeout 60 "${mpi[@]}" -np 1 "$polyprobe" "${run[@]}" --data mine.csv --validation-fraction 0.25 \
  --test-fraction 0.25 : -np 1 "$polyprobe" "${run[@]}" --data other/mine.csv \
  --validation-fraction 0.25 --test-fraction 0.25 >data.out 2>&1 && fail "a rank without its data trained"
grep -q "rank 1 of 2: cannot open 'other/mine.csv'" data.out ||
  fail "the rank that cannot read its data is not named: $(cat data.out)"

# 4. A backend that cannot load on one rank: rank 1 runs a copy of the host without the install's
# plugin folder, so --backend cpu_tbb is not found there.
mkdir -p bare/bin
cp "$polyprobe" bare/bin/polyprobe
mkdir -p bare/lib && for f in "$(dirname "$polyprobe")"/../lib/*.so*; do ln -s "$f" bare/lib/; done
timeout 60 "${mpi[@]}" -np 1 "$polyprobe" "${run[@]}" --backend cpu_tbb : -np 1 bare/bin/polyprobe \
  "${run[@]}" --backend cpu_tbb >backend.out 2>&1 && fail "a rank without its backend trained"
grep -q "rank 1 of 2: .*cpu_tbb" backend.out || fail "the rank without cpu_tbb is not named: $(cat backend.out)"
[[ $(grep -c "cannot start" backend.out) == 1 ]] || fail "the backend failure is not said once: $(cat backend.out)"

# 5. NCCL asked for where a rank cannot use it (no GPU, a build without NCCL, or ranks sharing
# a GPU): the job ends on every rank, bounded, naming the rank, the reason and the way out.
timeout 60 "${mpi[@]}" -np 2 "$polyprobe" "${run[@]}" --rank-exchange nccl >nccl.out 2>&1
code=$?
((code != 0 && code != 124)) || fail "--rank-exchange nccl without a usable GPU gave exit $code"
grep -q "rank-exchange nccl: rank 0 cannot use NCCL: .*use --rank-exchange mpi" nccl.out ||
  fail "the NCCL refusal does not name the rank, the reason and the way out: $(cat nccl.out)"

# 6. Bad values are refused before any work.
"$polyprobe" train --rank-timeout -1 >bad.out 2>&1
[[ $? == 2 ]] && grep -q -- "--rank-timeout must be" bad.out || fail "--rank-timeout -1: $(cat bad.out)"
"$polyprobe" train --rank-exchange gloo >bad.out 2>&1
[[ $? == 2 ]] && grep -q -- "--rank-exchange must be auto, mpi or nccl, got 'gloo'" bad.out ||
  fail "--rank-exchange gloo: $(cat bad.out)"
"$polyprobe" train --rank-waits spin >bad.out 2>&1
[[ $? == 2 ]] && grep -q -- "--rank-waits must be auto, poll or pause, got 'spin'" bad.out ||
  fail "--rank-waits spin: $(cat bad.out)"
"$polyprobe" train --rank-balance fair >bad.out 2>&1
[[ $? == 2 ]] && grep -q -- "--rank-balance must be auto, wall or cpu, got 'fair'" bad.out ||
  fail "--rank-balance fair: $(cat bad.out)"

if ((failures > 0)); then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all MPI train checks passed"
