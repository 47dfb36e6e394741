"""Reading a hooked method's arguments by name, resolved once per target (see :mod:`llmtrace.integrations._targets`)."""

from __future__ import annotations

from llmtrace.integrations._targets import Getter, Hook, binder

__all__ = ["Getter", "Hook", "binder"]
