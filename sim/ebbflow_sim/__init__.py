"""`ebbflow-sim`: a discrete-event simulator of a GPU cluster that runs the operator's own policies.

Role: show at a scale no test machine has what a policy is worth (job completion time, utilisation,
loss at a cutoff) against gang-scheduled and restart-on-preemption baselines. Layers: `trace` (jobs),
`cluster` (nodes and spot preemptions), `simulation` (the event loop, calling `decide()` as the
operator's `decide` does), `cli` (flags, output). Pure: no Kubernetes I/O, no wall clock; a run
is a function of its flags and seed.
"""
