# Local Kubernetes control plane for tests (real apiserver/etcd/controller-manager/
# scheduler built from Go modules + kwok fake nodes).  Included by the top-level
# Makefile; see tests/cluster/README.md.
PYTHON ?= .venv/bin/python
MLBENCH_CACHE ?= $(HOME)/.cache/mlbench
export MLBENCH_CACHE

.PHONY: k8s-bins cluster-up cluster-down cluster-env cluster-status cluster-import-image test-realnode

## k8s-bins: build kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, kubelet, kube-proxy, etcd, kwok, coredns
## and the NetworkPolicy enforcer kube-router, Kueue's manager, helm and kind (cached; the builds overlap: downloads of one while another compiles).
## KUEUE_BUILD=background (what `make test` sets) does not wait for Kueue's manager: it goes on compiling while the images
## build and the first tests run, and its tests wait for it (build-kueue.sh's lock; its log: $MLBENCH_CACHE/kueue-build.log);
## helm and kind likewise (build-helm.sh's and build-kind.sh's locks; their logs: $MLBENCH_CACHE/helm-build.log,
## $MLBENCH_CACHE/kind-build.log)
KUEUE_BUILD ?= wait
k8s-bins:
	tests/cluster/build-netpol.sh >/dev/null & netpol=$$!; kueue=""; \
	if [ "$(KUEUE_BUILD)" = background ]; then \
	  mkdir -p "$(MLBENCH_CACHE)"; nohup tests/cluster/build-kueue.sh >"$(MLBENCH_CACHE)/kueue-build.log" 2>&1 & \
	  nohup tests/cluster/build-helm.sh >"$(MLBENCH_CACHE)/helm-build.log" 2>&1 & \
	  nohup tests/cluster/build-kind.sh >"$(MLBENCH_CACHE)/kind-build.log" 2>&1 & \
	else tests/cluster/build-kueue.sh >/dev/null & kueue=$$!; tests/cluster/build-helm.sh >/dev/null & helm=$$!; \
	  tests/cluster/build-kind.sh >/dev/null & kind=$$!; fi; \
	tests/cluster/build-k8s.sh; wait $$netpol; if [ -n "$$kueue" ]; then wait $$kueue && wait $$helm && wait $$kind; fi

## cluster-up: start the local cluster (idempotent); prints the kubeconfig path
cluster-up: k8s-bins $(PYTHON)
	$(PYTHON) -m tests.cluster up

## cluster-down: stop every cluster process and wipe etcd data (idempotent)
cluster-down: $(PYTHON)
	$(PYTHON) -m tests.cluster down

## cluster-env: eval "$$(make -s cluster-env)" to point kubectl (and ctr: MLBENCH_CONTAINERD_ADDRESS) at the cluster
cluster-env: $(PYTHON)
	@$(PYTHON) -m tests.cluster env

cluster-status: $(PYTHON)
	$(PYTHON) -m tests.cluster status

## cluster-import-image: ARCHIVE=img.tar: side-load a docker-archive/OCI tar into every real node's containerd
cluster-import-image: $(PYTHON)
	@test -n "$(ARCHIVE)" || { echo "usage: make cluster-import-image ARCHIVE=path/to/image.tar" >&2; exit 2; }
	$(PYTHON) -m tests.cluster import-image $(ARCHIVE)

## test-realnode: the real nodes' tests only (pods in containerd, DNS and Services across nodes, OOM, volumes)
test-realnode: k8s-bins $(PYTHON)
	$(PYTHON) -m pytest tests/cluster/test_node.py
