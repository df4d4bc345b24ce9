"""Layer 1, the shared vocabulary: the record's schema and container, the ``.fvz`` format, GPUs, formatting, errors.

Imports nothing else of fakeviz (see CONTRIBUTING.md and ``tests/core/test_layers.py``).
"""
