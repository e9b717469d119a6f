"""The repository's scripts (``hack/``, ``benchmarks/``: files, not packages) loaded as modules for their tests."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]


def load_script(relative: str) -> ModuleType:
    """``relative`` (e.g. ``hack/release.py``) as the module ``<folder>_<stem>`` (``hack_release``), registered in
    ``sys.modules`` so that its dataclasses and exceptions know their module; loaded once."""
    path = REPO / relative
    name = f"{path.parent.name}_{path.stem}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]  # not half a module for the next test
        raise
    return module
