"""The MLBench operator: turns a ``BenchmarkRun`` into an MPI world of pods and reports the truth about it.

Layout (docs/architecture.md): a floor shared by both resources (:mod:`.runtime`, :mod:`.podwatch`,
:mod:`.settings` on the leaf :mod:`.env`, :mod:`.kube`, the pure builders of :mod:`.runcontext`,
:mod:`.runobjects`, :mod:`.runpods`, :mod:`.podscheduling` and :mod:`.fetchjob`), and one wing per resource:
:mod:`.run` (admission, status, policies, lifecycle, outcome, results, executor, handlers) and :mod:`.sweep` (plan,
handlers). :mod:`.handlers` registers both wings' kopf handlers
explicitly. Nothing here imports torch.
"""

__version__ = "0.1.0"
