"""`versus-cp`: run the control plane (all-in-one or one service at a time) and operate it."""

__version__ = "0.1.0"
