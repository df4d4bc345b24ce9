"""Layer 2, the engine: fake sessions on any device, the CUDA shim, attention kernel choice, and the recorder
that fills a :class:`fakeviz._core.record.Record`. Imports only ``fakeviz._core``; never IPython or widgets.
"""
