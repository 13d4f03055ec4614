"""libtpu as torchtpu/_plugin.py finds it, without importing torch or
torchtpu (the tests that compile for a TPU topology run their work in child
processes): LIBTPU is its path or None, needs_libtpu skips a test without it."""

import importlib.util
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_spec = importlib.util.spec_from_file_location("_tpu_plugin_finder", os.path.join(ROOT, "torchtpu", "_plugin.py"))
_plugin = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_plugin)
LIBTPU = next((c for c in _plugin._candidates("tpu") if os.path.exists(c)), None)
needs_libtpu = pytest.mark.skipif(LIBTPU is None, reason="libtpu is not installed (pip install libtpu)")
