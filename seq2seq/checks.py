"""Checks of configuration values that fail with one line naming the setting and the fix.

Hydra hands values through as the YAML or the command line wrote them, so `model.training.lr=abc`
arrives as the string "abc"; these turn such values into a ValueError that says which
setting, what it got and what it needs, before any work starts.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any


def describe(value: Any) -> str:
    """A value as an error message shows it: strings quoted, so 'abc' reads as text."""
    return repr(value) if isinstance(value, str) else str(value)


def is_integer(value: Any) -> bool:
    """An int and not a bool (YAML's true is an int to Python)."""
    return isinstance(value, int) and not isinstance(value, bool)


def integer(name: str, value: Any, minimum: int | None = None) -> int:
    """value as an int (bools and fractions refused), at least minimum."""
    need = "an integer" if minimum is None else f"an integer >= {minimum}"
    if minimum == 1:
        need = "a positive integer"
    if not is_integer(value):
        raise ValueError(f"{name} must be {need}, got {describe(value)}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be {need}, got {value}")
    return value


def number(
    name: str,
    value: Any,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
) -> float:
    """value as a finite float within [low, high] (or open at either end)."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if ok:
        ok = math.isfinite(value)
        if ok and low is not None:
            ok = value > low if low_open else value >= low
        if ok and high is not None:
            ok = value < high if high_open else value <= high
    if not ok:
        if low == 0 and low_open and high is None:
            need = "a positive number"
        else:
            left = "(" if low_open else "["
            right = ")" if high_open else "]"
            lo = "-inf" if low is None else f"{low:g}"
            hi = "inf" if high is None else f"{high:g}"
            need = f"a number in {left}{lo}, {hi}{right}"
        raise ValueError(f"{name} must be {need}, got {describe(value)}")
    return float(value)


def choice(name: str, value: Any, options: tuple[Any, ...]) -> Any:
    if value not in options:
        raise ValueError(
            f"{name} must be one of {', '.join(map(str, options))}, got {describe(value)}"
        )
    return value


def nearest(name: str, known: Iterable[str]) -> str:
    """What an error about an unknown name `name` suggests: the nearest known names (by
    difflib's similarity, or the shared words of snake_case names, so n_layers finds
    num_encoder_layers), else all of them."""
    import difflib  # here: the core (which imports this module) imports only torch and itself

    known = list(known)
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
    words = set(name.split("_"))
    close += [k for k in known if k not in close and words & set(k.split("_")) - {"", "num"}]
    if close:
        return f"did you mean {', '.join(close[:3])}? (known: {', '.join(known)})"
    return f"known: {', '.join(known)}"


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1} (lists stay values), for reading and diffing configs."""
    if isinstance(tree, dict):
        out: dict[str, Any] = {}
        for key, value in tree.items():
            out.update(flatten(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: tree}
