"""Instruction counts under valgrind's callgrind, per thread: stable where CPU time on a shared
VM is not (its speed moved 2x between runs of the same arm on 2026-12-03)."""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path


def instructions_per_thread(argv: list[str]) -> dict[int, int]:
    """Run *argv* under callgrind (one output file per thread) and return each thread's total
    instructions by thread number; 1 is the main thread."""
    if shutil.which("valgrind") is None:
        raise SystemExit("--instructions needs valgrind (apt install valgrind)")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp, "cg.out")
        subprocess.run(["valgrind", "--tool=callgrind", "--separate-threads=yes", f"--callgrind-out-file={out}",
                        *argv], capture_output=True, text=True, check=True)
        return {int(path.name.rsplit("-", 1)[1]): int(re.findall(r"^summary: (\d+)", path.read_text(),
                                                                 re.MULTILINE)[-1])
                for path in Path(tmp).glob("cg.out-*")}
