"""``EXPLAIN`` of a Core statement, executed with its bound parameters (Postgres)."""

from __future__ import annotations

from typing import Any

from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.elements import ClauseElement
from sqlalchemy.sql.expression import Executable


class Explain(Executable, ClauseElement):
    """``EXPLAIN <statement>``: the plan rows of ``statement`` as Postgres would run it."""

    inherit_cache = False

    def __init__(self, statement: Any) -> None:
        self.statement = statement


@compiles(Explain, "postgresql")
def _explain(element: Explain, compiler: Any, **kw: Any) -> str:
    return "EXPLAIN " + str(compiler.process(element.statement, **kw))
