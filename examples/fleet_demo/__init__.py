"""The production tour: a real worker process, narrated from its own logs.

``python -m examples.fleet_demo.run_demo`` starts ``examples.fleet_demo.worker`` (a
worker process like ``taskq worker``, logging one JSON object per line) and walks
through rate-limit denials, an operator's cancel, cron budgets and a SIGTERM deploy,
printing what the worker logged and what the store recorded at each step.
"""
