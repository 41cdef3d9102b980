"""The one exception type the CLI turns into a one-line error and a non-zero exit code.

Raise `LocalpersError` with a message that names the file, line or field at fault and says what to do.
It does not format, log or exit; `localpers.cli` does that.
"""


class LocalpersError(Exception):
    """A user-facing error: its message is printed as one line, without a traceback."""

    exit_code: int = 1

    def __init__(self, message: str, *, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code
