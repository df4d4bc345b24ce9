"""Quantization libraries under fake tensors: bitsandbytes' own code on fake cpu and fake cuda (``bnb.py``)."""

from __future__ import annotations
