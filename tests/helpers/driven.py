"""What an engine's tests drove for real, printed at the end of the run: the suite says which
parts of vLLM or SGLang ran in their own processes, and `pytest -ra` says what was skipped."""

from __future__ import annotations

from typing import Any


class DrivenParts:
    """The parts one engine's tests drove, under one heading in pytest's terminal summary."""

    def __init__(self, heading: str) -> None:
        self.heading = heading
        self.parts: list[str] = []

    def add(self, part: str) -> None:
        self.parts.append(part)

    def report(self, terminalreporter: Any) -> None:
        if self.parts:
            terminalreporter.section(self.heading)
            for line in self.parts:
                terminalreporter.write_line(f"  - {line}")
