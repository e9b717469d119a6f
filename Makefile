# MLBench: the targets a contributor needs. `make help` lists them.
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

export MLBENCH_CACHE ?= $(HOME)/.cache/mlbench
VENV := .venv
PYTHON := $(VENV)/bin/python
RUN ?= manifests/examples/local-quick.yaml
PYTEST_ARGS ?=

.PHONY: help
help: ## list the targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-16s %s\n", $$1, $$2}'

.PHONY: system-deps
system-deps: ## install OpenMPI, Prometheus, OpenSSH and the test node's runtime (containerd, runc, CNI, podman, ...) from Debian when missing (needs root)
	@missing=""; \
	command -v mpirun >/dev/null || missing="$$missing openmpi-bin libopenmpi-dev"; \
	command -v prometheus >/dev/null || missing="$$missing prometheus"; \
	command -v ssh-keygen >/dev/null || missing="$$missing openssh-client"; \
	[ -x /usr/sbin/sshd ] || missing="$$missing openssh-server"; \
	command -v lua5.4 >/dev/null || missing="$$missing lua5.4"; \
	$(or $(MLBENCH_PYTHON),python3) -c 'import ensurepip' 2>/dev/null || missing="$$missing $$(basename $(or $(MLBENCH_PYTHON),python3))-venv"; \
	if [ "$$(id -u)" = 0 ]; then \
	  command -v containerd >/dev/null || missing="$$missing containerd"; \
	  command -v runc >/dev/null || missing="$$missing runc"; \
	  [ -x /usr/lib/cni/bridge ] || missing="$$missing containernetworking-plugins"; \
	  [ -x /usr/bin/catatonit ] || missing="$$missing catatonit"; \
	  command -v iptables >/dev/null || missing="$$missing iptables"; \
	  command -v ipset >/dev/null || missing="$$missing ipset"; \
	  dpkg-query -W -f='$${Status}' busybox-static 2>/dev/null | grep -q 'ok installed' || missing="$$missing busybox-static"; \
	  command -v podman >/dev/null || missing="$$missing podman"; \
	  command -v mmdebstrap >/dev/null || missing="$$missing mmdebstrap"; \
	fi; \
	if [ -n "$$missing" ] && [ "$$(id -u)" != 0 ]; then \
	  echo "system-deps: missing Debian packages:$$missing (install them as root: apt-get install$$missing)" >&2; \
	  exit 1; \
	fi; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi

.PHONY: install
install: system-deps ## make the Python environment (cached by constraints.txt) and install mlbench editable
	@bash hack/venv.sh >/dev/null

$(PYTHON):
	@$(MAKE) --no-print-directory install

.PHONY: lock
lock: $(PYTHON) ## re-pin constraints.txt from the current environment (constraints-plots.txt's packages excluded), then the images' hashed locks/ (uv; needs PyPI)
	{ echo "# Exact versions of every Python package (regenerate with \`make lock\`)."; \
	  $(PYTHON) -m pip freeze --all --exclude-editable | grep -vE '^(mlbench|pip)==' \
	    | grep -viE "^($$(grep -oE '^[A-Za-z0-9_.-]+' constraints-plots.txt | paste -sd'|'))=="; } > constraints.txt.tmp
	mv constraints.txt.tmp constraints.txt
	$(PYTHON) hack/lock.py

.PHONY: crds
crds: $(PYTHON) ## regenerate crds/bases from the pydantic models
	$(VENV)/bin/mlbench crds

.PHONY: lint
lint: $(PYTHON) ## ruff, mypy, the images' locks, dashboard ConfigMaps, namespaced RBAC and the Helm chart fresh, grafana's dashboard-linter
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PYTHON) -m mypy
	$(PYTHON) hack/lock.py --check
	$(PYTHON) hack/dashboards.py --check
	$(PYTHON) hack/namespaced-rbac.py --check
	$(PYTHON) hack/chart.py --check --kubectl "$(KUBECTL)"
	@# built from its Go module (cached); where it cannot be built, say why and go on,
	@# unless MLBENCH_REQUIRE_DASHBOARD_LINTER=1
	@if linter=$$(hack/build-dashboard-linter.sh); then \
	  rc=0; for f in grafana/dashboards/*.json; do \
	    echo "dashboard-linter lint --strict $$f"; "$$linter" lint --strict "$$f" || rc=1; done; exit $$rc; \
	elif [ -n "$${MLBENCH_REQUIRE_DASHBOARD_LINTER:-}" ]; then exit 1; \
	else echo "dashboard-linter: skipped, it could not be built here (reason above)" >&2; fi

.PHONY: dashboards
dashboards: $(PYTHON) ## regenerate manifests/monitoring/dashboards.yaml from grafana/dashboards
	$(PYTHON) hack/dashboards.py

.PHONY: namespaced-rbac
namespaced-rbac: $(PYTHON) ## regenerate manifests/namespaced (Roles per watched namespace) from the operator's ClusterRole
	$(PYTHON) hack/namespaced-rbac.py

.PHONY: chart
chart: $(PYTHON) ## regenerate charts/mlbench (the Helm chart) from the kustomize bases
	$(PYTHON) hack/chart.py --kubectl "$(KUBECTL)"

.PHONY: helm
helm: ## build helm from its Go module into the cache (tests/cluster/build-helm.sh) and print its path
	@echo "$$(tests/cluster/build-helm.sh)/bin/helm"

.PHONY: kind
kind: ## build kind from its Go module into the cache (tests/cluster/build-kind.sh) and print its path (docs/install.md, kind)
	@echo "$$(tests/cluster/build-kind.sh)/bin/kind"

.PHONY: fmt
fmt: $(PYTHON) ## format and autofix
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

.PHONY: test
test: KUEUE_BUILD = background
test: install k8s-bins e2e-images ## the whole suite: lint, CRD freshness, unit, multi-process and cluster tests
	$(MAKE) --no-print-directory lint
	$(VENV)/bin/mlbench crds --check
	$(PYTHON) -m pytest $(PYTEST_ARGS)

.PHONY: e2e-images
e2e-images: ## build the images the e2e tests load (cached by their inputs; needs root and podman or docker)
	@if [ "$$(id -u)" = 0 ] && { command -v podman || command -v docker; } >/dev/null; then \
	  bash hack/images.sh --debian-base; \
	else echo "e2e-images: skipped (needs root and podman or docker); the e2e tests will skip"; fi

.PHONY: e2e
e2e: install k8s-bins e2e-images ## end to end on the test cluster's real nodes: images, operator Deployment, runs in real pods
	$(PYTHON) -m pytest -m e2e tests/e2e tests/images $(PYTEST_ARGS)

# The test layers (tests/layers.py; their times in the README): unit, multiproc, cluster, e2e. `make test` runs them all.
.PHONY: test-unit
test-unit: install ## the unit layer: no process started (guarded), no cluster
	$(PYTHON) -m pytest -m unit $(PYTEST_ARGS)

.PHONY: test-multiproc
test-multiproc: install ## the multi-process layer: torch ranks, mpirun, sshd, prometheus, CLIs in subprocesses; no cluster
	$(PYTHON) -m pytest -m multiproc $(PYTEST_ARGS)

.PHONY: test-fast
test-fast: install ## the unit and multi-process layers: everything that needs no cluster and no image
	$(PYTHON) -m pytest -m "unit or multiproc" $(PYTEST_ARGS)

.PHONY: test-cluster
test-cluster: install k8s-bins ## the cluster layer: the real control plane with kwok nodes (e2e aside)
	$(PYTHON) -m pytest -m "cluster and not e2e" $(PYTEST_ARGS)

.PHONY: run-local
run-local: install ## the main job: a local benchmark run of $(RUN)
	$(VENV)/bin/mlbench run $(RUN) --local

.PHONY: bench
bench: install ## runner and operator benchmarks (print figures)
	$(PYTHON) benchmarks/runner_cpu_scaling.py
	$(PYTHON) benchmarks/operator_scale.py

# Registry and repository of both images: <IMAGE_REPO>/mlbench-operator, <IMAGE_REPO>/mlbench-runner (hack/images.sh).
IMAGE_REPO ?=
# The base of both images, pinned by digest: BASE_IMAGE=docker.io/library/python:3.11-slim-bookworm@sha256:<digest>
# (empty: hack/images.sh's local Debian base where mmdebstrap is installed, else the Dockerfiles' default).
BASE_IMAGE ?=

.PHONY: images
images: ## build the operator and runner images (docker or podman; cached by a hash of their inputs); IMAGE_REPO=registry/team BASE_IMAGE=name@sha256:...
	IMAGE_REPO=$(IMAGE_REPO) BASE_IMAGE=$(BASE_IMAGE) hack/images.sh build

.PHONY: sbom
sbom: ## copy both built images' SBOMs (CycloneDX JSON, inside each image at its label io.mlbench.sbom) to dist/sbom/
	IMAGE_REPO=$(IMAGE_REPO) hack/images.sh sbom

.PHONY: push
push: ## push what `make images` built to IMAGE_REPO (required: registry.example.com/team)
	IMAGE_REPO=$(IMAGE_REPO) hack/images.sh push

# kubectl for kustomize and the cluster targets: $MLBENCH_KUBECTL, else the test cluster's (make k8s-bins), else PATH's.
KUBECTL ?= $(or $(MLBENCH_KUBECTL),$(firstword $(wildcard $(MLBENCH_CACHE)/k8s-*/bin/kubectl)),kubectl)

.PHONY: release
release: $(PYTHON) ## dist/install.yaml and dist/mlbench-x.y.z.tgz (the chart; HELM=path, else make helm's) of VERSION=x.y.z (pyproject's version, with a CHANGELOG.md entry), images at IMAGE_REPO
	@test -n "$(VERSION)" || { echo "usage: make release VERSION=x.y.z IMAGE_REPO=registry.example.com/team" >&2; exit 2; }
	$(PYTHON) hack/release.py --version "$(VERSION)" --image-repo "$(IMAGE_REPO)" --kubectl "$(KUBECTL)" --out dist/install.yaml
	$(PYTHON) hack/chart.py --package dist --version "$(VERSION)" --image-repo "$(IMAGE_REPO)" --kubectl "$(KUBECTL)" $(if $(HELM),--helm "$(HELM)")

.PHONY: uninstall
uninstall: $(PYTHON) ## remove MLBench: sweeps and runs first (waited for), then catalog, policy, operator, CRDs; DELETE_DATASETS=1 also the dataset PVCs
	$(PYTHON) hack/uninstall.py --kubectl "$(KUBECTL)" $(if $(DELETE_DATASETS),--delete-datasets) $(if $(UNINSTALL_TIMEOUT),--timeout $(UNINSTALL_TIMEOUT))

.PHONY: images-load
images-load: ## import both images into every test node's containerd (MLBENCH_CONTAINERD_ADDRESSES, from python -m tests.cluster env)
	hack/images.sh load

.PHONY: clean
clean: ## remove build outputs and results in the work tree (keeps the caches)
	rm -rf .venv build *.egg-info crds/*.egg-info .mypy_cache .ruff_cache .pytest_cache mlbench-results
	find . -name __pycache__ -type d -prune -exec rm -rf {} +

include tests/cluster/cluster.mk
