"""Layer 5, front ends: the ``%%fake`` magics and the ``fakeviz`` command line."""
