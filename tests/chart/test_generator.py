"""hack/chart.py's pure parts: placeholders and escaping, the policy's image format, the staleness check."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from mlbench_operator.policy import repository_patterns
from tests.scripts import load_script

chart = load_script("hack/chart.py")


def test_templater_escapes_the_sources_braces_and_puts_expressions_in() -> None:
    t = chart.Templater()
    doc = {"metadata": {"name": "x", "namespace": chart.NS}, "data": {"legend": "{{rank}} of }}"}, "spec": {}}
    doc["spec"]["image"] = t.value('{{ include "mlbench.image" . }}')
    t.line(doc["spec"], "{{- with .Values.a }}\nnodeSelector: {{ toJson . }}\n{{- end }}")
    text = t.text([doc])
    assert '{{ "{{" }}rank{{ "}}" }} of {{ "}}" }}' in text
    assert 'image: {{ include "mlbench.image" . }}\n' in text
    assert "  namespace: {{ $.Release.Namespace }}\n" in text
    assert "  {{- with .Values.a }}\n  nodeSelector: {{ toJson . }}\n  {{- end }}\n" in text
    assert "__chart_" not in text


def test_allowed_images_format_is_the_operators_patterns() -> None:
    fmt = chart.allowed_images_format()
    repo = "registry.example.com/team/mlbench-runner"
    assert fmt % (repo, repo) == repr(list(repository_patterns(f"{repo}:1.2.3")))


def test_extra_args_need_one_per_namespace() -> None:
    def dep(args: list[str]) -> dict[str, object]:
        return {"spec": {"template": {"spec": {"containers": [{"args": args}]}}}}

    assert (
        chart.extra_args(dep(["-a"]), dep(["-a", "--namespace=n1", "--namespace=n2"]), ["n1", "n2"]) == "--namespace="
    )
    with pytest.raises(chart.ChartError, match="one per watched namespace"):
        chart.extra_args(dep(["-a"]), dep(["-a", "--namespace=n1"]), ["n1", "n2"])
    with pytest.raises(chart.ChartError):
        chart.extra_args(dep(["-a"]), dep(["-b", "--namespace=n1"]), ["n1"])


def test_stale_names_changed_missing_and_extra_files(tmp_path: Path) -> None:
    files = {"Chart.yaml": "a\n", "templates/x.yaml": "b\n", "crds/c.yaml": "c\n"}
    chart.write(files, tmp_path / "c")
    assert chart.stale(files, tmp_path / "c") == []
    (tmp_path / "c" / "templates" / "x.yaml").write_text("hand edit\n")
    (tmp_path / "c" / "templates" / "extra.yaml").write_text("d\n")
    (tmp_path / "c" / "crds" / "c.yaml").unlink()
    assert chart.stale(files, tmp_path / "c") == ["crds/c.yaml", "templates/extra.yaml", "templates/x.yaml"]


def test_values_schema_limits_the_scope() -> None:
    schema = chart.values_schema()
    assert schema["properties"]["rbac"]["properties"]["scope"]["enum"] == ["cluster", "namespaced"]
    assert (
        yaml.safe_load(
            chart.values_yaml(
                {"repository": "r", "resources": {}, "nodeSelector": {}, "tolerations": []}, ["n"], "https://x"
            )
        )["rbac"]["scope"]
        == "cluster"
    )
