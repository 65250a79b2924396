"""Runnable examples shipped with taskq (``python -m taskq.examples.quickstart``)."""
