"""Code shared by every process of the control plane and by the collector. The vocabulary sits at
the top (errors with stable codes and their one transport mapping, limits, protocol versions);
everything else is a package by what it holds, in the order tests/unit/test_layering.py checks."""
