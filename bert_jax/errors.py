"""The errors a user can cause, as the command-line entry points report them: one line
`<command>: <message>` on stderr, exit status 1, no traceback.

Every `python -m bert_jax...` entry point catches `USER_ERRORS` around its work and raises
`exit_with(command, error)` (or prints its message and returns 1, where main returns a status). Readers and jobs raise these types with a message that names the input
(file, line, flag or config field) and what is wrong with it; any other exception is a defect and
keeps its traceback.
"""

from __future__ import annotations

# ValueError: bad content or settings (UnicodeDecodeError and json.JSONDecodeError are ValueErrors);
# OSError: a path that is missing, a file where a directory is needed, no permission, no space
# (FileNotFoundError, NotADirectoryError, FileExistsError, checkpointing.CheckpointSaveError);
# FloatingPointError: a non-finite loss during training.
USER_ERRORS = (ValueError, OSError, FloatingPointError)


def exit_with(command: str, error: BaseException) -> SystemExit:
    """SystemExit whose message is `<command>: <error>` on one line (later lines of the error's text are
    joined with "; "); raising it prints the message on stderr and exits with status 1."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return SystemExit(f"{command}: {'; '.join(lines) or type(error).__name__}")
