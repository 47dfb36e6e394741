"""What the engine adapters (vLLM, SGLang) share: the all-or-nothing target check and the
instrumentor built on it, argument binding by name, and number coercion for engine values.

An engine adapter hooks a dozen methods spread over several modules and processes.
Before it patches anything, every target is imported and checked: the method is
there and its signature names each parameter the hook reads. Any difference, or an
engine version outside the declared range, keeps the whole adapter off: patching half
a pipeline would produce request traces that look complete and are not.

A hook is a plain function put in the class in place of the method (``Patches.replace``),
not a wrapt proxy: several run every engine step (schedule, forward dispatch, outputs), and
a proxy on a class attribute is bound anew at each access and calls its wrapper with the
bound method, an argument tuple and a dict.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import wrapt

from llmtrace._safety import warn_once
from llmtrace.integrations._base import Instrumentor

#: What takes a target's place: called as the method itself, ``hook(self, *args, **kwargs)``,
#: and calls ``original(self, *args, **kwargs)``.
Hook = Callable[..., Any]
#: Makes a target's hook from the original method and its parameters' positions (``Checked.positions``).
HookMaker = Callable[[Callable[..., Any], dict[str, int]], Hook]
Getter = Callable[[tuple[Any, ...], dict[str, Any]], Any]


@dataclass(frozen=True)
class Target:
    """One hooked method: where it lives, and the parameters the hook binds by name."""

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
    """``"0.33.0"`` / ``"0.33.1.dev4+g123"`` -> (0, 33, 1); None if unparsable."""
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


def number(value: Any, kind: type) -> Any:
    """*value* as an int or float (*kind*); None for None, a bool, garbage, NaN or infinity."""
    if kind is int and value.__class__ is int:
        return value  # what engines report nearly always (several per step): one test, not a conversion
    if kind is float and type(value) is float:
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, bool):
        return None
    try:
        result = kind(value)
    except (TypeError, ValueError):
        return None
    if isinstance(result, float) and not math.isfinite(result):
        return None
    return result


class EngineInstrumentor(Instrumentor):
    """An engine adapter: the installed version and every target are checked before anything is
    patched; any problem logs one warning naming it and the adapter stays off."""

    #: How the warning names the engine ("vLLM").
    label: ClassVar[str] = ""
    targets: ClassVar[tuple[Target, ...]] = ()
    supported_min: ClassVar[tuple[int, ...]] = ()
    supported_max_exclusive: ClassVar[tuple[int, ...]] = ()

    def __init__(self) -> None:
        super().__init__()
        self.problems: list[str] = []

    def instrument(self) -> None:
        """Check the installed engine first: an unsupported version or any changed target -> off."""
        if self.active:
            return
        try:
            self.problems = self.preflight()
        except Exception as exc:  # noqa: BLE001 - a broken check must not break the engine's import
            self.problems = [f"target check failed: {type(exc).__name__}: {exc}"]
        if self.problems:
            warn_once(f"{self.name}:off", "llmtrace: %s adapter is OFF for %s %s (supported %s): %s", self.label,
                      self.distribution, self.installed_version(), self.supported, "; ".join(self.problems))
            return
        super().instrument()

    def preflight(self) -> list[str]:
        version = self.installed_version()
        if not version_supported(version, self.supported_min, self.supported_max_exclusive):
            return [f"version {version} is outside the supported range {self.supported}"]
        return check_targets(self.targets)[1]

    def hook_for(self, checked: Checked) -> HookMaker | None:
        """The hook maker of a checked target; None for a target that is checked but not hooked."""
        raise NotImplementedError

    def _patch(self) -> None:
        checked, problems = check_targets(self.targets)
        if problems:  # changed between preflight and now (a concurrent import): stay off
            raise RuntimeError("; ".join(problems))
        for item in checked:
            make = self.hook_for(item)
            if make is not None and not self.patches.replace(item.target.module, item.target.path,
                                                             _method_like(make, item.positions)):
                raise RuntimeError(f"could not hook {item.target.module}.{item.target.path}")


def _method_like(make: HookMaker, positions: dict[str, int]) -> Callable[[Callable[..., Any]], Hook]:
    """The hook, carrying the original's name, docstring and ``__wrapped__`` (so ``inspect.signature``
    still reads the engine's parameters, and the target check passes on a patched class)."""

    def build(original: Callable[..., Any]) -> Hook:
        return functools.update_wrapper(make(original, positions), original)

    return build
