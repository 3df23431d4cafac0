"""The reference collector agent (`versus-collector`) and its supervisor."""

__version__ = "0.1.0"
