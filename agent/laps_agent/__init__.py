"""laps data plane: the LAPS engine, its scheduling core, and the length-aware gateway.

Importing this package imports nothing heavy: the operator image has no torch.
"""
from __future__ import annotations

__version__ = "0.1.0"
