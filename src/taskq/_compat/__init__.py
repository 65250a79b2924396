"""The only places taskq reaches into another library's private attributes.

One module per library, each for something that library offers no public route to, with
a version guard (the versions its internals were checked against), a fallback to the
public path for any other version, and a test that fails when the library changes
(``tests/unit/test_compat.py``). Everything else in taskq uses public APIs only
(``tests/unit/test_no_private_access.py`` checks it).
"""
