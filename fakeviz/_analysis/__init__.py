"""Layer 3, analysis: pure functions of a :class:`~fakeviz._core.record.Record` to DataFrames and plain data.

Imports ``fakeviz._core`` (and, for FLOP formulas, ``fakeviz._engine.flops``); never views or front ends.
"""
