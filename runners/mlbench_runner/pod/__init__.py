"""The run's other pods and containers, none of which imports torch: the launcher (``mlbench-runner launch``,
mpirun and the termination log), the worker's sshd wrapper (``worker``), the dataset fetch Job
(``fetch-dataset``) and the netem init container (``netem``)."""
