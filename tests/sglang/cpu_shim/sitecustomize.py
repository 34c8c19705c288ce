"""Test-only CPU adjustment for SGLang's PD hand-off, loaded by the SGLang servers the tests
start (PYTHONPATH=tests/sglang/cpu_shim); nothing outside tests/ ships it.

Why: with the Mooncake transfer backend, SGLang 0.5.23's prefill `_send_kv_chunk` takes a
CUDA-only path (device tensors of KV indices) because `MooncakeKVSender.supports_host_tensor_indices`
is True. On a machine without CUDA the same class must take its host path, which setting the
flag False selects. The class is patched right after its module is first imported (an import
hook), so nothing is imported early and every SGLang process gets the same behaviour.
(The decode side's CPU adjustment is a launch flag: --disaggregation-decode-retraction-backup
cpu_tensor, set by tests/sglang/servers.py.)
"""
from __future__ import annotations

import importlib.abc
import sys

_MODULE = "sglang.srt.disaggregation.mooncake.conn"


def _patch(module) -> None:
    module.MooncakeKVSender.supports_host_tensor_indices = False


class _AfterImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != _MODULE:
            return None
        sys.meta_path.remove(self)
        try:
            import importlib.util

            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return None
        original_exec = spec.loader.exec_module

        def exec_module(module):
            original_exec(module)
            _patch(module)

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _AfterImport())
