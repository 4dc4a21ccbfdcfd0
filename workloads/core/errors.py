"""One exception type for every user-facing mistake.

A `UsageError` carries a message that names the problem and the fix. Entry points
catch it, print the message alone (no traceback) and exit with status 2. Anything else
that escapes is a bug and keeps its traceback.
"""


class UsageError(Exception):
    """Bad input the user can fix: the message says what and how."""

    exit_code = 2


class TransportMismatch(UsageError):
    """The fabric label and the transport actually used disagree."""

    exit_code = 3
