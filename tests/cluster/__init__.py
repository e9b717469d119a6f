"""Local Kubernetes control plane (real apiserver + kwok) for MLBench tests."""
