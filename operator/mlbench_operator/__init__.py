"""The MLBench operator: turns a ``BenchmarkRun`` into an MPI world of pods and reports the truth about it.

Layout (kopf's own idiom): pure functions build Kubernetes objects (:mod:`.builders`) and decide
what to do (:mod:`.reconcile`); :mod:`.handlers` is thin kopf glue; :mod:`.kube` performs the
API calls. Nothing here imports torch.
"""

__version__ = "0.1.0"
