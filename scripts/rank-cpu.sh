#!/usr/bin/env bash
# Where each rank's CPU goes in a step of `polyprobe bench scale`, by function (docs/scale.md):
# what N ranks pay a rank and a step beside what one process pays over N. A function that costs
# a rank as much as one process is work every rank repeats; one that shrinks by N is shared.
#
#   scripts/rank-cpu.sh POLYPROBE [RANKS] [WORKLOAD] [BEFORE]
#     RANKS     default 16: run oversubscribed with pausing waits, so it works on any machine
#               (wall times then mean nothing; CPU times do)
#     WORKLOAD  default mlp256-full
#     BEFORE    another polyprobe binary, measured the same way as a column of its own
#
# perf samples every rank at 4 kHz for two runs of 20 and 80 timed steps (8 untimed first); the
# difference over the 60 extra steps leaves out start-up. Columns: ms a rank and a step at N
# ranks (each binary), ms a step of one process over N, and the first's excess over that.
# Needs perf (linux-perf) and mpirun. The kernel's task switches are the oversubscription's own.
set -euo pipefail
for tool in perf mpirun; do
  command -v "$tool" >/dev/null ||
    { echo "rank-cpu.sh: needs $tool (Debian: apt-get install linux-perf openmpi-bin)" >&2; exit 2; }
done
[[ $# -ge 1 && -x $1 ]] || { echo "usage: scripts/rank-cpu.sh POLYPROBE [RANKS] [WORKLOAD] [BEFORE]" >&2; exit 2; }
polyprobe=$(realpath "$1")
ranks=${2:-16}
workload=${3:-mlp256-full}
before=${4:+$(realpath "$4")}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# BINARY N TAG: perf data per rank for 20 and 80 timed steps.
profile() {
  local binary=$1 n=$2 tag=$3
  mkdir -p "$out/$tag"
  for steps in 20 80; do
    mpirun --oversubscribe --bind-to none -np "$n" bash -c "exec perf record -F 4000 -q \
      -o $out/$tag/$steps-\$OMPI_COMM_WORLD_RANK.data $binary bench scale --quiet \
      --repeats $steps --scale-workloads $workload --scale-threads 1 --scale-waits pause" \
      >/dev/null 2>&1
  done
}
profile "$polyprobe" "$ranks" ranks
profile "$polyprobe" 1 alone
columns="ranks:$ranks alone:1"
if [[ -n $before ]]; then
  profile "$before" "$ranks" before
  columns="before:$ranks $columns"
fi
python3 - "$out" "$ranks" $columns <<'PY'
import collections, glob, os, re, subprocess, sys
out, ranks, columns = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def samples(pattern):
    total = collections.Counter()
    for path in glob.glob(pattern):
        report = subprocess.run(["perf", "report", "-i", path, "--no-children", "--stdio",
                                 "--sort", "dso,symbol", "-F", "sample,dso,symbol"],
                                capture_output=True, text=True).stdout
        for line in report.splitlines():
            m = re.match(r"\s*(\d+)\s+(\S+)\s+\[.\]\s+(.*)$", line)
            if m and not line.startswith("#"):
                total[(m.group(2)[:24], m.group(3).strip()[:96])] += int(m.group(1))
    return total
def per_rank_step(tag, n):  # ms: the 60 extra steps' samples at 4 kHz, over the ranks
    few, many = samples(f"{out}/{tag}/20-*.data"), samples(f"{out}/{tag}/80-*.data")
    return {k: (many[k] - few[k]) / 60 / n / 4.0 for k in set(few) | set(many)}
data = {}
for column in columns:
    tag, n = column.split(":")
    data[tag] = per_rank_step(tag, int(n))
if not any(data["alone"].values()):
    sys.exit("rank-cpu.sh: perf recorded no samples (is kernel.perf_event_paranoid too high, "
             "or did polyprobe fail? run its bench scale command by hand)")
alone = {k: v / ranks for k, v in data["alone"].items()}
keys = set().union(*data.values())
excess = {k: data["ranks"].get(k, 0) - alone.get(k, 0) for k in keys}
head = [t for t in data if t != "alone"]
print(f"ms a rank and a step, {ranks} ranks; 'alone': one process's over {ranks}")
print("  ".join(f"{h:>8}" for h in head + ["alone", "excess"]) + "  function")
print("  ".join(f"{sum(data[h].values()):8.3f}" for h in head) +
      f"  {sum(alone.values()):8.3f}  {sum(excess.values()):8.3f}  (total)")
# The largest excesses of any column (a function one binary no longer runs shows too).
largest = lambda k: max(data[h].get(k, 0) - alone.get(k, 0) for h in head)
for k in sorted(keys, key=lambda k: -largest(k))[:32]:
    print("  ".join(f"{data[h].get(k, 0):8.3f}" for h in head) +
          f"  {alone.get(k, 0):8.3f}  {excess[k]:8.3f}  {k[0]} {k[1]}")
PY
