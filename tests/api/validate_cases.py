"""YAML files on which ``mlbench validate`` must agree with ``kubectl apply --dry-run=server``.

The shared examples (``tests/examples``) are read with PyYAML by the server-side tests, so they
hold only YAML that PyYAML and kubectl's go-yaml read alike. The cases here are whole files, as a
user passes them to both tools: YAML dialect (``y`` is a boolean for kubectl, ``1:20`` is not a
number), nulls, a status sent with the object, duplicate keys, several documents per file,
broken YAML. ``tests/api/test_validate.py`` checks the verdicts ``mlbench validate`` gives on
them; ``tests/api/test_validate_agrees.py`` checks that the API server gives the same.
"""

from __future__ import annotations

from dataclasses import dataclass

#: A run of the catalog's open-division task (any override allowed), completed by each case.
RUN = """\
apiVersion: mlbench.io/v1alpha1
kind: BenchmarkRun
metadata:
  name: case
spec:
  taskRef: {name: cifar10-resnet20-smoke}
"""

TASK = """\
apiVersion: mlbench.io/v1alpha1
kind: BenchmarkTask
metadata:
  name: case-task
spec:
  division: open
  model: {name: logistic-regression}
  dataset: {name: epsilon, format: libsvm, path: /data/epsilon}
  training:
    batchSizePerWorker: 100
    learningRate: {schedule: multistep, perSample: 0.001, milestones: [5]}
    maxEpochs: 10
  goal: {target: 0.89}
  runner: {image: mlbench/mlbench-runner:0.1.0}
"""


def item(text: str, depth: int = 1) -> str:
    """``text`` (a document) as a YAML list item ``depth`` lists deep, after its ``- ``: every line but the
    first indented to match."""
    return text.replace("\n", "\n" + "  " * depth).rstrip()


@dataclass(frozen=True)
class Case:
    id: str
    text: str
    #: the API server's verdict, and so the one ``mlbench validate`` must give
    accepted: bool
    #: what validate's output must mention (the field, or the start of the message)
    mention: str = ""


CASES = [
    # YAML as kubectl's go-yaml reads it, not as PyYAML's YAML 1.1
    Case("y-is-a-boolean", RUN + "  overrides: {nesterov: y, momentum: 0.9}\n", accepted=True),
    Case("n-is-a-boolean", RUN + "  overrides: {nesterov: n}\n", accepted=True),
    Case("exponent-without-dot", RUN + "  seed: 1e3\n", accepted=True),
    Case("octal-0o", RUN + "  seed: 0o17\n", accepted=True),
    Case("sexagesimal-is-a-string", RUN + "  seed: 1:20\n", accepted=False, mention="spec.seed"),
    Case("timestamp-is-a-string", RUN + "  image: 2024-01-01\n", accepted=True),
    Case("binary-is-a-number", RUN + "  image: 0b101\n", accepted=False, mention="spec.image"),
    Case("whole-float-read-by-cel", TASK.replace("maxEpochs: 10", "maxEpochs: 10.0"), accepted=True),
    Case("nan-is-not-json", RUN + "  overrides: {learningRate: .nan}\n", accepted=False, mention="learningRate"),
    # strict types
    Case("string-for-integer", RUN + '  workers: "4"\n', accepted=False, mention="spec.workers"),
    Case("string-for-boolean", RUN + '  overrides: {nesterov: "true"}\n', accepted=False, mention="nesterov"),
    Case("string-for-number", RUN + '  overrides: {momentum: "0.9"}\n', accepted=False, mention="momentum"),
    Case("boolean-for-integer", RUN + "  slotsPerWorker: true\n", accepted=False, mention="spec.slotsPerWorker"),
    Case("fraction-for-integer", RUN + "  workers: 1.5\n", accepted=False, mention="spec.workers"),
    Case("integer-for-number", RUN + "  overrides: {learningRate: 1}\n", accepted=True),
    Case("number-for-string", RUN + "  image: 42\n", accepted=False, mention="spec.image"),
    Case(
        "boolean-label",
        RUN.replace("  name: case\n", "  name: case\n  labels: {team: yes}\n"),
        accepted=False,
        mention="metadata.labels.team",
    ),
    # nulls: kubectl apply (client-side) drops them
    Case("null-with-default", RUN + "  workers: null\n", accepted=True),
    Case("null-optional-object", RUN + "  overrides: null\n", accepted=True),
    Case("null-in-a-list", RUN + "  scheduling: {tolerations: [null]}\n", accepted=False, mention="tolerations"),
    # status: dropped by the API server, but unknown fields in it are refused
    Case("status-is-ignored", RUN + "status: {phase: Exploded, workers: {ready: -1}}\n", accepted=True),
    Case("status-unknown-field", RUN + "status: {verdict: great}\n", accepted=False, mention="status.verdict"),
    # metadata
    Case("unknown-metadata-field", RUN.replace("  name: case\n", "  name: case\n  owner: me\n"), False, "owner"),
    Case("no-api-version", RUN.replace("apiVersion: mlbench.io/v1alpha1\n", ""), False, "apiVersion"),
    Case("no-kind", RUN.replace("kind: BenchmarkRun\n", ""), accepted=False, mention="kind"),
    # the file
    Case("duplicate-key-last-wins", RUN + "  workers: 2000\n  workers: 2\n", accepted=True, mention="duplicate"),
    Case("empty-file", "# nothing here\n", accepted=False, mention="no objects"),
    Case("only-empty-documents", "---\n---\n", accepted=False, mention="no objects"),
    Case("list-document", "- a\n- b\n", accepted=False, mention="a list"),
    Case("broken-yaml", RUN + "  overrides: {momentum: [0.9}\n", accepted=False, mention="invalid YAML"),
    Case("tab-indent", RUN + "\tworkers: 2\n", accepted=False, mention="invalid YAML"),
    Case("task-and-run", TASK + "---\n" + RUN.replace("cifar10-resnet20-smoke", "case-task"), accepted=True),
    Case("empty-documents-between", "---\n" + TASK + "---\n---\n" + RUN, accepted=True),
    Case(
        "second-document-invalid",
        TASK + "---\n" + RUN + "  workers: 0\n",
        accepted=False,
        mention="document 2 (BenchmarkRun case): spec.workers",
    ),
    Case(
        "second-document-broken",
        TASK + "---\n" + RUN + "  workers: [\n",
        accepted=False,
        mention="document 2: invalid YAML",
    ),
    # a List's items, applied one by one as kubectl applies them
    Case(
        "list-with-an-invalid-item",
        "apiVersion: v1\nkind: List\nitems:\n- " + item(TASK) + "\n- " + item(RUN + "  workers: 0\n") + "\n",
        accepted=False,
        mention="spec.workers",
    ),
    Case(
        "list-of-valid-items",
        "apiVersion: v1\nkind: List\nitems:\n- " + item(RUN) + "\n",
        accepted=True,
    ),
    # kubectl does not flatten twice: a valid run inside a List inside a List is refused
    Case(
        "list-in-a-list",
        "apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: List\n  items:\n  - "
        + item(RUN, depth=2)
        + "\n",
        accepted=False,
        mention="list item 0: kind: a List inside a List",
    ),
    Case(
        "typed-list-in-a-list",
        "apiVersion: v1\nkind: List\nitems:\n- apiVersion: mlbench.io/v1alpha1\n"
        "  kind: BenchmarkRunList\n  items:\n  - " + item(RUN, depth=2) + "\n",
        accepted=False,
        mention="a BenchmarkRunList inside a List",
    ),
    Case(
        "list-with-a-null-item",
        "apiVersion: v1\nkind: List\nitems:\n- null\n- " + item(RUN) + "\n",
        accepted=False,
        mention="list item 0: expected a Kubernetes object (a mapping), got null",
    ),
    Case(
        "list-items-null", "apiVersion: v1\nkind: List\nitems: null\n", accepted=False, mention="items: expected a list"
    ),
    Case("list-items-missing", "apiVersion: v1\nkind: List\n", accepted=False, mention="items: Field required"),
    Case("list-items-a-mapping", "apiVersion: v1\nkind: List\nitems: {}\n", accepted=False, mention="got a mapping"),
    Case("list-items-empty", "apiVersion: v1\nkind: List\nitems: []\n", accepted=False, mention="no objects"),
    # a typed list: its items may leave out apiVersion and kind (as the API server's own lists do) and take
    # the list's; an item of another kind is refused
    Case(
        "typed-list-items-take-the-lists-kind",
        "apiVersion: mlbench.io/v1alpha1\nkind: BenchmarkRunList\nitems:\n- metadata: {name: case}\n"
        "  spec:\n    taskRef: {name: cifar10-resnet20-smoke}\n",
        accepted=True,
    ),
    Case(
        "typed-list-item-checked-as-its-kind",
        "apiVersion: mlbench.io/v1alpha1\nkind: BenchmarkRunList\nitems:\n- metadata: {name: case}\n"
        "  spec:\n    taskRef: {name: cifar10-resnet20-smoke}\n    workers: 0\n",
        accepted=False,
        mention="spec.workers",
    ),
    Case(
        "typed-list-item-of-another-kind",
        "apiVersion: mlbench.io/v1alpha1\nkind: BenchmarkRunList\nitems:\n- "
        + item(RUN)
        + "\n- apiVersion: v1\n  kind: ConfigMap\n  metadata: {name: cm}\n",
        accepted=False,
        mention="list item 1: kind: expected BenchmarkRun",
    ),
    Case(
        "typed-list-item-without-kind",
        "apiVersion: mlbench.io/v1alpha1\nkind: BenchmarkRunList\nitems:\n- apiVersion: mlbench.io/v1alpha1\n"
        "  metadata: {name: case}\n  spec:\n    taskRef: {name: cifar10-resnet20-smoke}\n",
        accepted=False,
        mention="list item 0: kind: expected BenchmarkRun",
    ),
    Case(
        "typed-list-items-null",
        "apiVersion: mlbench.io/v1alpha1\nkind: BenchmarkRunList\nitems: null\n",
        accepted=False,
        mention="items: expected a list",
    ),
    # quantities and names as the server's RE2 and its numeric checks read them
    Case(
        "task-name-not-dns", TASK.replace("name: case-task", "name: Case_Task"), accepted=False, mention="metadata.name"
    ),
    Case(
        "train-subset-beyond-2-53",
        RUN + "  overrides: {trainSubset: 9007199254740992}\n",
        accepted=False,
        mention="spec.overrides.trainSubset",
    ),
    Case("negative-integer-cpu", RUN + "  resources: {cpu: -2}\n", accepted=False, mention="spec.resources.cpu"),
    Case("integer-cpu", RUN + "  resources: {cpu: 2, memory: 4294967296}\n", accepted=True),
    Case(
        "quantity-in-arabic-indic-digits",
        RUN + '  resources: {memory: "\u0664Gi"}\n',
        accepted=False,
        mention="spec.resources.memory",
    ),
    Case(
        "quantity-longer-than-64",
        RUN + f'  resources: {{memory: "{"1" * 65}"}}\n',
        accepted=False,
        mention="spec.resources.memory",
    ),
    Case(
        "quantity-with-a-final-newline",
        RUN + '  resources: {memory: "4Gi\\n"}\n',
        accepted=False,
        mention="spec.resources.memory",
    ),
    Case(
        "name-with-a-final-newline",
        RUN.replace("name: case", 'name: "case\\n"'),
        accepted=False,
        mention="metadata.name",
    ),
]
