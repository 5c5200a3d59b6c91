"""One training step over virtual nodes: the engine, its exact sums and gradient buckets, the update,
band-limited layers and the memory budget they follow. Knows nothing of processes or rendezvous.
"""
