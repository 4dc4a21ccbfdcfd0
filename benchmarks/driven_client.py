"""An engine's own benchmark client kept alive in its own venv (the engine pins its own torch),
driven one round at a time: `driver` is a Python program that prints READY once imported,
then runs one benchmark per "go" line on stdin and answers with a line "FBJSON {...}". Its
import (a minute on 2 busy cores) is paid once, not once per round."""

import json
import subprocess
import tempfile
from pathlib import Path


class DrivenClient:
    def __init__(self, name: str, python: Path, driver: str, args: list[str], env: dict | None = None) -> None:
        self.name = name
        self.proc = subprocess.Popen([str(python), "-c", driver, *args], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     cwd=tempfile.gettempdir(), env=env)
        self.log: list[str] = []
        self._until("READY")

    def _until(self, prefix: str) -> str:
        for line in self.proc.stdout:
            self.log.append(line)
            if line.startswith(prefix):
                return line
        raise RuntimeError(f"{self.name}'s benchmark client exited; its last output:\n" + "".join(self.log[-30:]))

    def round(self) -> dict:
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        return json.loads(self._until("FBJSON ")[len("FBJSON "):])

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(60)


def abba_rounds(sides: dict, rounds: int):
    """Burn-in (each side once, unrecorded), then `rounds` rounds in ABBA order: yields
    (round index, side name, that side's result)."""
    for fn in sides.values():
        fn()
    names = list(sides)
    for k in range(rounds):
        for n in (names if k % 2 == 0 else names[::-1]):
            yield k, n, sides[n]()
