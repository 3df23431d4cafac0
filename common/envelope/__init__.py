"""The signed task envelope (``VERSUS-TASK-V1``): canonical bytes, wire form, signing, verification.

Everything here is pure code with no I/O so the control plane and collectors
share one implementation, fed values in tests. The format is specified
byte for byte in docs/envelope.md and arbitrated by vectors/envelope/.
"""
