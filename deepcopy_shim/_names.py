"""How messages name a class: `Outer.Inner` without a function's `<locals>`, with its article."""

from __future__ import annotations

from typing import Any

__all__ = ["a_name_of", "class_name"]


def class_name(cls: type) -> str:
    """`Outer.Inner` for a nested class, without the `<locals>` of one defined in a function."""
    return cls.__qualname__.rsplit("<locals>.", 1)[-1]


def a_name_of(obj: Any) -> str:
    """`a Net`, `an Actor`, `an MLP`: the class of `obj` with its article, as read aloud."""
    name = class_name(type(obj))
    return f"{_article(name)} {name}"


def _article(name: str) -> str:
    if name[:2].isupper():  # an acronym (MLP, LSTM, GPT2Model): read letter by letter
        return "an" if name[0] in "AEFHILMNORSX" else "a"
    first, rest = name[:1].lower(), name[1:4].lower()
    if first == "u" and rest.startswith(("ni", "se", "su", "ti", "ra", "re", "ri", "ro")):
        return "a"  # a Unit, a User: a "you" sound
    return "an" if first in "aeiou" else "a"
