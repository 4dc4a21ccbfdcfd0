"""One exception type for every user-facing mistake.

A `UsageError` carries a message that names the problem and the fix. Entry points
catch it, print the message alone (no traceback) and exit with its `exit_code`: 2 for
bad input, 1 for a `Fault` (something that ran failed), 3 for a transport mismatch; the
table is docs/reliability.md's. Anything else that escapes is a bug and keeps its traceback.
"""


class UsageError(Exception):
    """Bad input the user can fix: the message says what and how."""

    exit_code = 2


class Fault(UsageError):
    """Something that was started failed (a server died or never became ready, a peer never
    joined, no port was free): one line like bad input, but exit 1, since the input was not
    what was wrong and the same command may pass on a retry."""

    exit_code = 1


class TransportMismatch(UsageError):
    """The fabric label and the transport actually used disagree."""

    exit_code = 3


class RecordNotWritten(UsageError):
    """The output filesystem refused a record (full, read-only, over quota). The measured
    record is kept elsewhere when any place takes it (`kept`), and the message says where."""

    exit_code = 1

    def __init__(self, message: str, kept=None):
        super().__init__(message)
        self.kept = kept  # pathlib.Path of the rescued record, or None when nothing took it


class AlreadyRecorded(Exception):
    """This trial of this point has an ok record already: the job is skipped, not measured
    again (a rerun of a sweep with its run_id resumes at the first point not recorded)."""
