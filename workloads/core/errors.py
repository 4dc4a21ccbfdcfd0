"""One base for every one-line error, and the one place that prints it.

A `UsageError` carries a message that names the problem and the fix, and the exit code the
command ends with: 2 for bad input; its `Fault`s (something that ran failed: a server, a
peer, a measurement that came out wrong) 1; a transport mismatch 3; the table is
docs/reliability.md's. Entry points catch it and hand it to `say`, which prints its line alone
(no traceback) and returns the code to exit with. Anything else that escapes is a bug and
keeps its traceback.
"""

from __future__ import annotations

import sys


class UsageError(Exception):
    """Bad input the user can fix: the message says what and how. The base of every one-line error."""

    exit_code = 2

    def line(self) -> str:
        """What `say` prints."""
        return f"error: {self}"


class Fault(UsageError):
    """Something that was started failed (a server died or never became ready, a peer never
    joined, no port was free, a measurement came out wrong): one line like bad input, but exit
    1, since the input was not what was wrong and the same command may pass on a retry."""

    exit_code = 1


class TransportMismatch(UsageError):
    """The fabric label and the transport actually used disagree."""

    exit_code = 3


class RecordNotWritten(Fault):
    """The output filesystem refused a record (full, read-only, over quota). The measured
    record is kept elsewhere when any place takes it (`kept`), and the message says where."""

    def __init__(self, message: str, kept=None):
        super().__init__(message)
        self.kept = kept  # pathlib.Path of the rescued record, or None when nothing took it


def say(e: UsageError) -> int:
    """Print the error's one line on stderr; the code to exit with."""
    print(e.line(), file=sys.stderr, flush=True)
    for_the_agent(e.line())
    return e.exit_code


def for_the_agent(line: str) -> None:
    """Under torchrun, the line as the rank's error file, so that the agent's ChildFailedError
    summary shows it as the root cause's traceback (its last field before the closing border)
    instead of "To enable traceback see ...". torchrun sets TORCHELASTIC_ERROR_FILE per rank;
    the JSON is the one its ErrorHandler.record_exception writes and ProcessFailure reads back
    (torch 2.x distributed/elastic/multiprocessing/errors/error_handler.py and __init__.py:
    message.message, message.extraInfo.py_callstack, message.extraInfo.timestamp). A file that
    is already there is the rank's own earlier failure, kept; one that cannot be written leaves
    the summary as torchrun makes it."""
    import json
    import os
    import time

    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path or os.path.exists(path):
        return
    data = {"message": {"message": line, "extraInfo": {"py_callstack": line, "timestamp": str(int(time.time()))}}}
    try:
        with open(path, "w") as f:
            json.dump(data, f)
    except OSError:
        pass


class AlreadyRecorded(Exception):
    """This trial of this point has an ok record already: the job is skipped, not measured
    again (a rerun of a sweep with its run_id resumes at the first point not recorded)."""
