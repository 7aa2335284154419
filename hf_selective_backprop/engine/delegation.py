"""`Held`: an attribute of the engine that one of its collaborators holds."""

from __future__ import annotations


class Held:
    """A class attribute of `SelectionEngine` read from and set on one collaborator (``holder``, an attribute of
    the engine), under ``name`` there (by default its own name): one object owns the value, so the engine and the
    collaborator cannot disagree about it, and code that reads or sets ``engine.epoch`` keeps working."""

    def __init__(self, holder: str, name: str | None = None):
        self.holder, self.name = holder, name

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = self.name or name

    def __get__(self, engine, owner: type | None = None):
        if engine is None:
            return self
        return getattr(getattr(engine, self.holder), self.name)

    def __set__(self, engine, value) -> None:
        setattr(getattr(engine, self.holder), self.name, value)
