"""Test-only stand-in for vLLM (CPU runs of SGLang, tests/sglang): see _custom_ops.py."""
