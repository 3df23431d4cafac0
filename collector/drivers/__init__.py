"""Drivers: how the collector reaches devices, loaded from the `versus.collector.drivers` entry points."""
