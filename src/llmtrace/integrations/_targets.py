"""The all-or-nothing target check shared by the engine adapters (vLLM, SGLang).

An engine adapter wraps a dozen methods spread over several modules and processes.
Before it patches anything, every target is imported and checked: the method is
there and its signature names each parameter the wrapper reads. Any difference, or an
engine version outside the declared range, keeps the whole adapter off: patching half
a pipeline would produce request traces that look complete and are not.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import wrapt

Wrapper = Callable[[Any, Any, tuple[Any, ...], dict[str, Any]], Any]
Getter = Callable[[tuple[Any, ...], dict[str, Any]], Any]


@dataclass(frozen=True)
class Target:
    """One wrapped method: where it lives, and the parameters the wrapper binds by name."""

    module: str
    path: str
    params: tuple[str, ...]
    side: str  # the engine process it runs in (e.g. "api", "engine", "scheduler")


@dataclass(frozen=True)
class Checked:
    """A target that passed the check: its parameters' positions (``self`` not counted)."""

    target: Target
    positions: dict[str, int]


def check_targets(targets: tuple[Target, ...]) -> tuple[list[Checked], list[str]]:
    """Import every target module and check each method and its named parameters.

    Returns the checked targets and one line per problem; any problem means the
    adapter stays off.
    """
    checked: list[Checked] = []
    problems: list[str] = []
    for target in targets:
        where = f"{target.module}.{target.path}"
        try:
            importlib.import_module(target.module)
            _parent, _attribute, original = wrapt.resolve_path(target.module, target.path)
            parameters = list(inspect.signature(original).parameters)
        except Exception as exc:  # noqa: BLE001 - a missing module/attribute is what we report
            problems.append(f"{where}: not found ({type(exc).__name__}: {exc})")
            continue
        if parameters and parameters[0] == "self":
            parameters = parameters[1:]
        missing = [name for name in target.params if name not in parameters]
        if missing:
            problems.append(f"{where}: parameter(s) {', '.join(missing)} not in ({', '.join(parameters)})")
            continue
        checked.append(Checked(target, {name: parameters.index(name) for name in target.params}))
    return checked, problems


def binder(positions: dict[str, int], name: str) -> Getter:
    """Read argument *name* by the position the signature gave it, or by keyword (no per-call bind)."""
    index = positions[name]

    def get(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if name in kwargs:
            return kwargs[name]
        return args[index] if index < len(args) else None

    return get


def version_tuple(version: str | None) -> tuple[int, ...] | None:
    """``"0.33.0"`` / ``"0.33.1.dev4+g123"`` -> (0, 33, 1); None if unparseable."""
    if not version:
        return None
    parts: list[int] = []
    for piece in version.split("+")[0].split("."):
        digits = ""
        for char in piece:
            if not char.isdigit():
                break
            digits += char
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts) or None


def version_supported(version: str | None, low: tuple[int, ...], high_exclusive: tuple[int, ...]) -> bool:
    parsed = version_tuple(version)
    return parsed is not None and low <= parsed < high_exclusive
