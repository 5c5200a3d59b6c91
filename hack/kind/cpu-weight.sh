#!/usr/bin/env bash
# Gives the kind cluster's containers the CPU weight of the processes they run, on cgroup v1 hosts.
#
# Under cgroup v1, Docker puts every container in one group (/docker) whose cpu.shares is 1024: the
# weight of ONE ordinary host process. Whenever the host is busy, the whole cluster (API server,
# etcd, four kubelets and containerds, the CNI agents, the operator, Prometheus and every trainer)
# gets what one of the busy host processes gets. Measured here: two spinning containers beside four
# spinning host processes got 69 % of one core at 1024 and 176 % at 8192. In CI, beside the trainer
# tier (load average 25-41), the e2e trainers then missed their rendezvous heartbeats and the image
# import crawled. The group gets KIND_CPU_SHARES instead (default 32768: the weight of the ~30 busy
# processes the cluster runs, as if they ran on the host); 0 leaves it alone.
#
# Shares only matter while the CPUs are contended: an idle host gives the cluster everything anyway.
# Best effort: on cgroup v2 (systemd's slices weigh the containers per unit) or where the group is
# not writable this says so and changes nothing. The weight stays until dockerd restarts.
#
# Usage: hack/kind/cpu-weight.sh NODE   (a container of the cluster)
set -euo pipefail

node=${1:?usage: $0 NODE}
shares=${KIND_CPU_SHARES:-32768}
((shares > 0)) || exit 0

read -r id pid < <(docker inspect --format '{{.Id}} {{.State.Pid}}' "$node")
# cgroup v1's cpu line of the node's init, e.g. "1:cpu:/docker/<id>/init.scope" (a kind node's
# systemd moves itself below its container's group); none on cgroup v2.
group=$(awk -F: '$2 ~ /(^|,)cpu(,|$)/ {print $3}' "/proc/$pid/cgroup")
mount=$(awk '$3 == "cgroup" && $4 ~ /(^|,)cpu(,|$)/ {print $2; exit}' /proc/mounts)
if [[ -z $group || -z $mount ]]; then
  echo "[cpu-weight] not cgroup v1: the containers' CPU weight is left to the host" >&2
  exit 0
fi
parent=$mount${group%%/"$id"*} # the group that holds every container: /docker by default
if [[ $group != */"$id"* || $parent == "$mount" || ! -w $parent/cpu.shares ]]; then
  echo "[cpu-weight] $parent/cpu.shares is not a writable container group: left alone" >&2
  exit 0
fi
echo "$shares" >"$parent/cpu.shares"
echo "[cpu-weight] $parent: cpu.shares $shares (the cluster weighs as $((shares / 1024)) host processes)" >&2
