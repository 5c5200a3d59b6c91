#!/usr/bin/env bash
# CPU seconds for CI's timings: where a saturated two-core run spends its cores.
#
#   hack/ci-cpu.sh machine            busy CPU seconds of the whole machine since boot (/proc/stat)
#   hack/ci-cpu.sh containers PREFIX  CPU seconds used so far by the Docker containers named PREFIX*
#                                     (the kind nodes and every pod in them; cgroup v1 or v2)
#
# Prints one number (whole seconds); 0 when the figure cannot be read on this machine. ci-test.sh
# takes differences of these around its steps; a lane's own processes are counted with bash's `times`.
set -uo pipefail

case ${1:-} in
  machine)
    # user nice system irq softirq steal, in USER_HZ ticks
    awk -v hz="$(getconf CLK_TCK)" '$1 == "cpu" { print int(($2 + $3 + $4 + $7 + $8 + $9) / hz) }' /proc/stat
    ;;
  containers)
    total=0
    for id in $(docker ps -q --filter "name=^${2:?usage: $0 containers PREFIX}" --no-trunc 2>/dev/null); do
      if [[ -r /sys/fs/cgroup/cpuacct/docker/$id/cpuacct.usage ]]; then
        nanoseconds=$(<"/sys/fs/cgroup/cpuacct/docker/$id/cpuacct.usage")
      elif [[ -r /sys/fs/cgroup/system.slice/docker-$id.scope/cpu.stat ]]; then
        nanoseconds=$(($(awk '$1 == "usage_usec" { print $2 }' "/sys/fs/cgroup/system.slice/docker-$id.scope/cpu.stat") * 1000))
      else
        nanoseconds=0
      fi
      total=$((total + nanoseconds))
    done
    echo $((total / 1000000000))
    ;;
  *)
    echo "usage: $0 machine | containers PREFIX" >&2
    exit 2
    ;;
esac
