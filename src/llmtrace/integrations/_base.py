"""The instrumentor contract every integration follows, and the patch bookkeeping.

An integration is a small class: an argument-free constructor, a ``name``, the
``trigger`` module whose import activates it, a declared ``supported`` version
range, and ``_patch()`` / (optionally) ``_unpatch()``. ``instrument()`` and
``uninstrument()`` are idempotent; :class:`Patches` restores the *identical*
original objects, so ``uninstrument()`` leaves the library exactly as it was.
"""

from __future__ import annotations

import functools
import importlib.metadata
import logging
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import wrapt

from llmtrace._safety import record_error, warn_once

log = logging.getLogger("llmtrace")

_MISSING = object()
#: The mark on what llmtrace put in a library's place: a wrapt proxy (which keeps ``_self_``
#: attributes on itself) or a plain replacement function.
_OURS = "_self_llmtrace"


class Patches:
    """Wrap attributes with wrapt and remember the originals to put back."""

    def __init__(self) -> None:
        self._saved: list[tuple[Any, str, Any]] = []

    def wrap(self, module: str, path: str, wrapper: Callable[..., Any]) -> bool:
        """Wrap ``module:path`` (e.g. ``"tokenizers", "Tokenizer.encode"``); False if it is missing."""
        return self._put(module, path, lambda original: wrapt.FunctionWrapper(original, wrapper))

    def wrap_all(self, targets: Sequence[tuple[str, str, Callable[..., Any]]]) -> list[str]:
        """Wrap every ``(module, path, wrapper)`` of *targets*, or none of them: returns the
        ``module.path`` of each one that is missing (then nothing was wrapped). For hooks into
        a library's internals that only make sense together."""
        missing = []
        for module, path, _ in targets:
            try:
                wrapt.resolve_path(module, path)
            except (AttributeError, ImportError):
                missing.append(f"{module}.{path}")
        if not missing:
            for module, path, wrapper in targets:
                self.wrap(module, path, wrapper)
        return missing

    def replace(self, module: str, path: str, make: Callable[[Any], Any]) -> bool:
        """Replace ``module:path`` with ``make(original)``, a plain function; False if it is missing.

        For hooks on per-token and per-chunk paths: a wrapt proxy on a class attribute is bound
        anew at every access and calls its wrapper with the bound method, an argument tuple and a
        dict — ~3k instructions a call more than a plain function (a streamed decode through two
        pass-through hooks: 13k against 6.4k, callgrind)."""
        return self._put(module, path, make)

    def _put(self, module: str, path: str, make: Callable[[Any], Any]) -> bool:
        """Put ``make(original)`` in place of ``module:path``, marked as llmtrace's; nothing if
        the attribute is llmtrace's already. False if it is missing."""
        try:
            parent, attribute, original = wrapt.resolve_path(module, path)
        except (AttributeError, ImportError):
            warn_once(f"missing:{module}:{path}", "llmtrace: %s.%s not found; not tracing it", module, path)
            return False
        # (Not ``isinstance(original, wrapt.ObjectProxy)``: with wrapt 2's C extension a
        # FunctionWrapper is not an instance of the Python-level ObjectProxy.)
        if getattr(original, _OURS, False):
            return True
        replacement = make(original)
        setattr(replacement, _OURS, True)
        raw = vars(parent).get(attribute, _MISSING) if hasattr(parent, "__dict__") else _MISSING
        setattr(parent, attribute, replacement)
        self._saved.append((parent, attribute, raw))
        return True

    def set_attr(self, parent: Any, attribute: str, value: Any) -> None:
        """Replace an attribute outright (for hooks that are not function wrappers)."""
        raw = vars(parent).get(attribute, _MISSING)
        setattr(parent, attribute, value)
        self._saved.append((parent, attribute, raw))

    def restore(self) -> None:
        for parent, attribute, raw in reversed(self._saved):
            try:
                if raw is _MISSING:
                    delattr(parent, attribute)
                else:
                    setattr(parent, attribute, raw)
            except (AttributeError, TypeError) as exc:
                record_error(f"unpatch:{attribute}", exc)
        self._saved.clear()


# Post-import hooks cannot be removed, so each (integration, submodule) gets one per process;
# it patches through whichever instance of the integration is live when the module loads.
_lazy_lock = threading.Lock()
_lazy_hooked: set[tuple[str, str]] = set()
_lazy_owner: dict[str, Instrumentor] = {}


def _on_lazy_import(name: str, module: str, _imported: Any) -> None:
    owner = _lazy_owner.get(name)
    if owner is not None:
        owner._apply_lazy(module)


class Instrumentor:
    """Base class of every integration."""

    name: ClassVar[str] = ""
    trigger: ClassVar[str] = ""
    #: Distribution name and the versions llmtrace is tested with, for ``doctor`` and warnings.
    distribution: ClassVar[str] = ""
    supported: ClassVar[str] = ""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._active = False
        self.patches = Patches()
        self._lazy_targets: dict[str, Callable[[], None]] = {}
        self._lazy_done: set[str] = set()

    @property
    def active(self) -> bool:
        return self._active

    def instrument(self) -> None:
        with self._lock:
            if self._active:
                return
            try:
                self._patch()
            except Exception as exc:  # noqa: BLE001 - a failed patch leaves the library untouched
                self.patches.restore()
                record_error(f"patch:{self.name}", exc)
                return
            self._active = True

    def uninstrument(self) -> None:
        with self._lock:
            if not self._active:
                return
            try:
                self._unpatch()
            finally:
                if _lazy_owner.get(self.name) is self:
                    del _lazy_owner[self.name]
                self._lazy_targets, self._lazy_done = {}, set()
                self.patches.restore()
                self._active = False

    def patch_on_import(self, targets: Mapping[str, Callable[[], None]]) -> None:
        """Run each ``submodule -> patch`` of *targets* now if the submodule is imported, else
        when it is: for libraries that load lazily (transformers), so a process that only
        tokenizes never imports the modeling code because of llmtrace. A failing patch is
        recorded and leaves the other targets alone."""
        self._lazy_targets, self._lazy_done = dict(targets), set()
        _lazy_owner[self.name] = self
        for module in targets:
            if module in sys.modules:
                self._apply_lazy(module)
            with _lazy_lock:
                if (self.name, module) in _lazy_hooked:
                    continue
                _lazy_hooked.add((self.name, module))
            wrapt.register_post_import_hook(functools.partial(_on_lazy_import, self.name, module), module)

    def _apply_lazy(self, module: str) -> None:
        patch = self._lazy_targets.get(module)
        if patch is None or module in self._lazy_done:
            return
        self._lazy_done.add(module)
        try:
            patch()
        except Exception as exc:  # noqa: BLE001 - one submodule's patch failing leaves the rest traced
            record_error(f"patch:{self.name}:{module}", exc)

    def _patch(self) -> None:
        raise NotImplementedError

    def _unpatch(self) -> None:
        """Extra clean-up beyond restoring :attr:`patches` (hooks on live objects...)."""

    @classmethod
    def installed_version(cls) -> str | None:
        try:
            return importlib.metadata.version(cls.distribution or cls.trigger)
        except importlib.metadata.PackageNotFoundError:
            return None
