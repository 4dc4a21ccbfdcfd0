"""One exception type for every user-facing mistake.

A `UsageError` carries a message that names the problem and the fix. Entry points
catch it, print the message alone (no traceback) and exit with status 2. Anything else
that escapes is a bug and keeps its traceback.
"""


class UsageError(Exception):
    """Bad input the user can fix: the message says what and how."""

    exit_code = 2
    # Raised by every rank at the same point after their last collective, so the process
    # group is still whole and can be drained before exit (workloads/core/dist.py: drain).
    every_rank = False


class TransportMismatch(UsageError):
    """The fabric label and the transport actually used disagree."""

    exit_code = 3
    every_rank = True  # check_transport broadcasts the verdict; each rank raises on it
