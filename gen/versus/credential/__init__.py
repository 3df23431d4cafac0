"""Generated from protos/ by `make protos`. Do not edit."""
