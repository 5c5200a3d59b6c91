"""The operator's decision core: one pure pass from what it observed, the specs and the clock to
what it must write, `(observed state, spec, now) -> actions` (`decide`). Nothing here imports
kopf, the Kubernetes client or the operator's I/O shell; a policy is passed in, never imported.
"""
