"""The exception types the CLI turns into a one-line error and a non-zero exit code.

Raise `LocalpersError` with a message that names the file, line or field at fault and says what to do
(exit code 1: a state problem, such as a missing user or a fit that is needed first). Raise `InputError`
when something that came from outside is malformed: the content of a file (a history file, a user
archive, a GGUF model, a bundle manifest, signed metadata) or a command-line argument (a user name, task
or method name that cannot be, text that is not UTF-8): exit code 2, like a command-line usage error.
The same holds for a file localpers keeps whose content is damaged (a user's vector, state.json or history
that no longer parses or matches its checksum); one that is missing or cannot be opened is a state problem
(exit code 1). `StorageError` is a file that could not be written (full disk, read-only folder): a one-line
error that is still an `OSError` for code that catches those. None of them formats, logs or exits;
`localpers.cli.main` does that.
"""

BAD_INPUT_EXIT_CODE = 2
# How to add the publisher's libraries (training, Ray): localpers is installed from its checkout, not a registry
# (`pip install 'localpers[publish]'` would find nothing, or someone else's package), and torch's CPU build first.
PUBLISH_EXTRA_HINT = "in the localpers checkout run `pip install torch==2.13.0 && pip install '.[publish]'` (README, \"Publisher\")"


class LocalpersError(Exception):
    """A user-facing error: its message is printed as one line, without a traceback."""

    exit_code: int = 1

    def __init__(self, message: str, *, exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class UserBusy(LocalpersError):
    """Another localpers command holds the user's lock or fit lock: the same step can succeed once it finishes."""


class InputError(LocalpersError):
    """A malformed file, archive, download, argument or request from outside: exit code 2."""

    exit_code = BAD_INPUT_EXIT_CODE


class TextTooLong(InputError):
    """A text over what a task's prompt (`tasks.Task.check_text`) or the model's context carries; its message
    says by how much. The API names the request field it came in by it."""


class StorageError(LocalpersError, OSError):
    """A file could not be written (disk full, permissions): one line for the CLI, an OSError to callers."""
