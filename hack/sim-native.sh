#!/usr/bin/env bash
# The simulator's native build (`make sim-native`): the allocation, policy and simulator modules
# compiled with mypyc (the same Python source, type-checked and translated to C) into a copy of the
# package under build/sim-native, which `PYTHONPATH=build/sim-native` puts first. The source tree
# stays pure Python: the operator, its image and every test run the .py files. The build is checked
# before it is used: the same simulations, pure and native, must print the same JSON.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
out=build/sim-native
modules=(ebbflow_operator/decision/allocator ebbflow_operator/policies/__init__ ebbflow_operator/policies/packing
  ebbflow_operator/policies/greedy ebbflow_operator/policies/goodput ebbflow_operator/policies/quality
  ebbflow_operator/policies/job_metrics ebbflow_operator/policies/throughput ebbflow_operator/policies/search
  ebbflow_operator/policies/loss_curve ebbflow_sim/allocation ebbflow_sim/simulation ebbflow_sim/job_state
  ebbflow_sim/cluster ebbflow_sim/trace)

rm -rf "$out"
mkdir -p "$out"
cp -r operator/ebbflow_operator sim/ebbflow_sim "$out/"
find "$out" -name __pycache__ -prune -exec rm -rf {} +
files=()
for m in "${modules[@]}"; do files+=("$m.py"); done
echo "compiling ${#files[@]} modules with mypyc (about 2 minutes on 2 cores)"
(cd "$out" && MYPYPATH="$root/api" "$root/.venv/bin/mypyc" --config-file "$root/pyproject.toml" "${files[@]}" >mypyc.log 2>&1) || {
  tail -40 "$out/mypyc.log"
  exit 1
}

# Same decisions: a few small simulations (spot preemptions, time-slicing, room to grow with batch
# adaptation, two GPU types) for every policy, pure and native.
check='
import sys
from ebbflow_sim import cli
for args in (["--jobs", "60", "--gpus", "128", "--seed", "1"],
             ["--jobs", "40", "--gpus", "64", "--seed", "3", "--replicas", "2"],
             ["--jobs", "40", "--gpus", "128", "--seed", "4", "--elastic-max-factor", "4", "--adaptive-batch-fraction", "1"],
             ["--jobs", "40", "--gpus", "128", "--seed", "5", "--gpu-types", "A100:0.5:1,T4:0.5:0.3"]):
    cli.main([*args, "--json"])
'
pure=$(PYTHONPATH="$root/operator:$root/sim:$root/api" .venv/bin/python -c "$check")
native=$(PYTHONPATH="$root/$out:$root/api" .venv/bin/python -c "import ebbflow_operator.policies.goodput as p; assert p.__file__.endswith('.so'), p.__file__
$check")
if [ "$pure" != "$native" ]; then
  diff <(echo "$pure") <(echo "$native") | head -20
  echo "the native build decides differently from the source: not used" >&2
  rm -rf "$out"
  exit 1
fi
# No reference cycles either: `Simulation.run` turns the cyclic garbage collector off, and compiled
# code can make cycles the source does not (closures that capture each other).
cycles='
import gc
from ebbflow_sim.cluster import ClusterConfig
from ebbflow_sim.simulation import SimConfig, Simulation
from ebbflow_sim.trace import TraceConfig, generate
cluster = ClusterConfig(gpus=128, replicas=2, preempt_rate_per_hour=1.0)
jobs = generate(TraceConfig(jobs=40, gpus=128, elastic_max_factor=4, adaptive_batch_fraction=0.5), 4)
gc.collect()
gc.set_debug(gc.DEBUG_SAVEALL)
for policy in ("restart", "fair", "goodput", "quality"):
    Simulation(jobs, policy, SimConfig(cluster=cluster, seed=4)).run()
found = gc.collect()
assert found == 0, f"the native simulation left {found} objects in cycles: {sorted({type(o).__qualname__ for o in gc.garbage})}"
'
PYTHONPATH="$root/$out:$root/api" .venv/bin/python -c "$cycles" || {
  rm -rf "$out"
  exit 1
}
echo "native build in $out: $(echo "$pure" | wc -l) simulations decide as the pure build does, and leave no reference cycles"
