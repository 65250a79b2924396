"""Integrations with web frameworks: Django, Flask, FastAPI/Starlette.

Each is imported on its own (``taskq.contrib.django``, ``taskq.contrib.flask``,
``taskq.contrib.starlette``) and needs only its framework installed.
"""
