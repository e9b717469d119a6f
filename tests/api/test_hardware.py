"""The hardware record of a result: node labels joined by node name, and the grouping text (pure)."""

from __future__ import annotations

from pathlib import Path

from mlbench_api import hardware
from mlbench_api.results import RankHardware
from mlbench_runner.rank import hostinfo
from mlbench_runner.tools import scoring
from tests.factories import summary_for
from tests.runner.helpers import logreg_task, make_config

H100 = {
    "node.kubernetes.io/instance-type": "p5.48xlarge",
    "topology.kubernetes.io/zone": "us-east-1a",
    "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
    "nvidia.com/gpu.count": "8",
    "kubernetes.io/hostname": "n1",
}


def test_node_labels_join_each_rank_s_record_by_node_name(tmp_path: Path) -> None:
    s = summary_for(make_config(logreg_task(), tmp_path, 3), ttg=1.0)
    s.environment.hardware = [
        RankHardware(node="n1", driver="550.54.15", cuda="12.4"),
        RankHardware(node="n2", cuda="12.4"),
        RankHardware(node="n1", driver="550.54.15", cuda="12.4"),
    ]
    joined = hardware.with_node_labels(s, {"n1": H100}).environment.hardware
    assert joined is not None
    assert [(r.node, r.instance_type, r.zone, r.gpu_product, r.gpu_count, r.driver) for r in joined] == [
        ("n1", "p5.48xlarge", "us-east-1a", "NVIDIA-H100-80GB-HBM3", "8", "550.54.15"),
        ("n2", None, None, None, None, None),  # a node that could not be read keeps nulls
        ("n1", "p5.48xlarge", "us-east-1a", "NVIDIA-H100-80GB-HBM3", "8", "550.54.15"),
    ]
    assert hardware.hardware_nodes(s) == ["n1", "n2"]


def test_a_summary_with_only_node_names_gets_records_from_them(tmp_path: Path) -> None:
    s = summary_for(make_config(logreg_task(), tmp_path, 2), ttg=1.0)
    s.environment.nodes = ["a", "b"]
    joined = hardware.with_node_labels(s, {"b": {"topology.kubernetes.io/zone": "z"}}).environment.hardware
    assert joined == [RankHardware(node="a"), RankHardware(node="b", zone="z")]


def test_two_clusters_results_are_two_configurations(tmp_path: Path) -> None:
    config = make_config(logreg_task(), tmp_path, 1)
    a, b, c = (summary_for(config, ttg=1.0) for _ in range(3))
    a.environment.hardware = [RankHardware(node="x", instance_type="p5.48xlarge", zone="us-east-1a")]
    b.environment.hardware = [RankHardware(node="y", instance_type="a3-highgpu-8g", zone="us-central1-a")]
    c.environment.hardware = [RankHardware(node="z", instance_type="p5.48xlarge", zone="us-east-1a")]
    ca, cb, cc = (scoring.configuration(s, config) for s in (a, b, c))
    assert ca != cb
    assert ca == cc  # another node of the same kind: the same configuration
    assert len(scoring.group([scoring.run_result(s, config) for s in (a, b, c)])) == 2


def test_the_driver_version_is_read_from_the_kernel_module_s_line(tmp_path: Path) -> None:
    line = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023\nGCC version: 12\n"
    assert hostinfo.parse_driver(line) == "535.104.05"
    assert hostinfo.parse_driver("GCC version: 12") is None
    (tmp_path / "version").write_text(line)
    assert hostinfo.nvidia_driver(tmp_path / "version") == "535.104.05"
    assert hostinfo.nvidia_driver(tmp_path / "absent") is None


def test_each_rank_s_gathered_text_becomes_its_record() -> None:
    texts = [hostinfo.local_text("550.1", "12.4"), hostinfo.local_text(None, None)]
    assert hostinfo.rank_hardware(["n0", "n1"], texts) == [
        RankHardware(node="n0", driver="550.1", cuda="12.4"),
        RankHardware(node="n1"),
    ]
