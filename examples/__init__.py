"""Runnable taskq examples: ``examples.actors`` (one module per feature) and
``examples.fleet_demo`` (a real worker's logs narrated)."""
