"""A task's ``spec.dataset``: its format, where its bytes come from (a fetched source with its checksum, a volume, or
synthetic data) and where the ranks read it.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

from pydantic import ConfigDict, Field, WithJsonSchema, model_validator

from mlbench_api.common import (
    MAX_SAFE_INT,
    ApiModel,
    cel,
    re2_search,
)
from mlbench_api.contract import DATA_DIR
from mlbench_api.datasets import reserved_path


class DatasetFormat(StrEnum):
    CIFAR_PYTHON = "cifar10-python"  #: the standard ``cifar-10-batches-py`` pickles
    IMAGE_FOLDER = "image-folder"  #: ``train|test/<class>/*.jpg``
    IMAGE_TARBALL = "image-tarball"  #: the same folder tree inside a .tar.gz
    LIBSVM = "libsvm"  #: ``label idx:value ...`` text (epsilon's distribution format)
    NPZ = "npz"  #: dense ``x_train, y_train, x_test, y_test`` arrays
    PARALLEL_TEXT = "parallel-text"  #: a folder of ``train|test.<lang>`` sentence files and fairseq's ``dict.txt``
    WIKITEXT_TOKENS = "wikitext-tokens"  #: a folder of WikiText's ``wiki.train|valid|test.tokens``
    SYNTHETIC = "synthetic"  #: generated in process, for tests and smoke runs (a transformer: the synthetic pair)


class SyntheticData(ApiModel):
    """Shape of a generated stand-in dataset (e.g. epsilon's 2000 dense features)."""

    train_samples: Annotated[int, Field(ge=1, le=10_000_000)]
    """Number of generated training samples."""
    test_samples: Annotated[int, Field(ge=1, le=10_000_000)]
    """Number of generated test samples."""
    features: Annotated[int, Field(ge=1, le=100_000)] = 2000
    """Dense features per sample (default 2000, epsilon's dimension)."""
    seed: Annotated[int, Field(ge=0, le=MAX_SAFE_INT)] = 0
    """Seed of the generator: the same seed gives the same data on every rank and every run."""


_SHA256 = r"^[0-9a-f]{64}$"
_URL = r"^https?://[^\s/?#]+[^\s]*$"
#: ``/data/<one or more segments>``: the fetcher writes only inside the dataset volume.
_UNDER_DATA = r"^/data(/[^/]+)+$"
_DOT_SEGMENT = r"(^|/)[.][.]?(/|$)"  # no backslashes: the same text is a CEL string literal


class DatasetSource(ApiModel):
    """Where the operator downloads a dataset from, and the bytes it must be.

    Content-addressed: the sha256 (not the URL) identifies the data, so a mirror with the same
    bytes is the same dataset, N runs fetch it once per namespace, and a corrupted or swapped
    download can never be trained on.
    """

    url: Annotated[str, Field(min_length=8, max_length=2048, pattern=_URL)] = Field(
        description="http or https URL of the file (a .tar/.tar.gz archive when unpack is true)."
    )
    sha256: Annotated[str, Field(pattern=_SHA256, max_length=64)] = Field(
        description="SHA-256 of the downloaded file, 64 lowercase hex digits; other bytes fail the run "
        "ChecksumMismatch."
    )
    unpack: bool = Field(
        default=False, description="Extract the .tar/.tar.gz archive into dataset.path instead of storing the file."
    )
    strip_components: Annotated[int, Field(ge=0, le=8)] = Field(
        default=0, description="With unpack: drop this many leading path components of every member (tar's option)."
    )


#: A core/v1 VolumeSource, passed through (free-form) but for ``name``, declared only so that CEL can refuse it:
#: the operator names the workers' data volume itself.
VolumeSource = Annotated[
    dict[str, Any],
    WithJsonSchema(
        {
            "type": "object",
            "x-kubernetes-preserve-unknown-fields": True,
            "properties": {
                "name": {
                    "type": "string",
                    "description": "Not allowed: a VolumeSource has no name (the operator calls the volume data).",
                    "maxLength": 63,
                }
            },
        }
    ),
]


class DatasetSpec(ApiModel):
    """Where the data lives in the cluster, or how to generate it."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "self.format == 'synthetic' ? has(self.synthetic) : has(self.path)",
                    "a synthetic dataset needs 'synthetic', any other format needs 'path'",
                    ".format",
                ),
                cel(
                    "!has(self.volume) || !has(self.volume.name)",
                    "volume.name must not be set: volume is a VolumeSource, the operator names the volume itself",
                    ".volume.name",
                ),
                cel(
                    "!(has(self.source) && has(self.volume))",
                    "source and volume are mutually exclusive: "
                    "a sourced dataset lives in the namespace's dataset volume",
                    ".source",
                ),
                cel(
                    f"!has(self.source) || (has(self.path) && self.path.matches('{_UNDER_DATA}') "
                    f"&& !self.path.matches('{_DOT_SEGMENT}'))",
                    "with a source, path must lie under /data/ (no '.' or '..' segments)",
                    ".path",
                ),
            ]
        }
    )

    name: Annotated[str, Field(min_length=1, max_length=63)]
    """Short name of the dataset (e.g. cifar10); names the fetch Job mlbench-dataset-<name>-<key> of a sourced one."""
    format: DatasetFormat
    """How the files are laid out: cifar10-python, image-folder, image-tarball, libsvm, npz, or synthetic (generated, no
    files)."""
    path: Annotated[str, Field(max_length=4096)] | None = None
    """Where the workers read the data (a file or folder; the volume is mounted at /data). Required unless format is
    synthetic; with source, must lie under /data/."""
    volume: VolumeSource | None = Field(
        default=None,
        description="A core/v1 VolumeSource (e.g. nfs, persistentVolumeClaim) mounted read-only at /data on every "
        "worker; exclusive with source.",
    )
    source: DatasetSource | None = Field(
        default=None,
        description="Download into the namespace's dataset volume before the workers start (exclusive with volume).",
    )
    train_subset: Annotated[int, Field(ge=1, le=MAX_SAFE_INT)] | None = Field(
        default=None, description="Train on the first N training samples only (smoke runs; changes the benchmark)."
    )
    test_subset: Annotated[int, Field(ge=1, le=MAX_SAFE_INT)] | None = Field(
        default=None, description="Evaluate on the first N test samples only (smoke runs; changes the benchmark)."
    )
    synthetic: SyntheticData | None = None
    """Shape of the generated data; required when format is synthetic."""

    @model_validator(mode="after")
    def _rules(self) -> DatasetSpec:
        if self.format is DatasetFormat.SYNTHETIC and self.synthetic is None:
            raise ValueError("synthetic: a synthetic dataset needs 'synthetic'")
        if self.format is not DatasetFormat.SYNTHETIC and self.path is None:
            raise ValueError("path: this dataset format needs 'path'")
        if self.volume is not None and "name" in self.volume:
            # {"name": "data", **volume} would rename the pod's volume away from its mount (a 422 on every create)
            raise ValueError(
                "volume.name: must not be set: volume is a VolumeSource, the operator names the volume itself"
            )
        if self.source is not None and self.volume is not None:
            raise ValueError(
                "source: source and volume are mutually exclusive: a sourced dataset lives in the "
                "namespace's dataset volume"
            )
        if self.source is not None and not path_under_data_root(self.path):
            raise ValueError(f"path: with a source, path must lie under {DATA_DIR}/ (no '.' or '..' segments)")
        reserved = reserved_path(self.path or "") if self.source is not None else None
        if reserved:
            raise ValueError(f"path: {reserved}")
        return self


def path_under_data_root(path: str | None) -> bool:
    """True for ``/data/<something>`` without ``.``/``..`` segments: the fetcher writes only inside the volume."""
    return path is not None and re2_search(_UNDER_DATA, path) and not re2_search(_DOT_SEGMENT, path)
