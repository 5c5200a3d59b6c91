"""Local Kubernetes control plane with fake GPU nodes, for tests, benchmarks and the demo."""
