"""The errors a user can cause, as the command-line entry points report them: one line
`<command>: <message>` on stderr, exit status 1, no traceback.

Every `python -m bert_jax...` entry point catches `USER_ERRORS` around its work and raises
`exit_with(command, error)` (or prints its message and returns 1, where main returns a status); those
built on absl run their main through `run`, those built on argparse parse with `ArgumentParser`; both
report the command line's errors (flags that cannot be parsed, a `--config.<field>` override of no field,
unexpected or missing arguments) the same way. Readers and jobs raise these types with a message that names the input
(file, line, flag or config field) and what is wrong with it; any other exception is a defect and
keeps its traceback.
"""

from __future__ import annotations

import argparse
import re
from typing import Any, Callable, Sequence

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


def run(main: Callable[[list[str]], Any], command: str, known_only: bool = False) -> None:
    """`absl.app.run(main)` with the command line's errors as `exit_with(command, error)`: one line on stderr,
    exit status 1, where absl prints two or more (its "FATAL Flags parsing error" and a usage hint, or the
    whole usage text) or ml_collections a traceback. The errors: an unknown flag, a flag value its parser
    rejects and a required flag not given (absl's `flags.Error`, naming the flag); a `--config.<path>`
    override naming no field of the recipe (ml_collections' KeyError / AttributeError); an
    `app.UsageError` that `main` raises (e.g. unexpected positional arguments). `known_only`: flags absl does
    not define are left in argv for `main` (another parser's options, e.g. Apache Beam's). Never returns:
    exits with main's return value as absl does.
    """
    from absl import app, flags

    def parse(argv: list[str]) -> list[str]:
        try:
            return flags.FLAGS(argv, known_only=known_only)
        except flags.Error as e:
            raise exit_with(command, e) from None
        except (KeyError, AttributeError, IndexError) as e:
            message = _unknown_override(argv, e)
            if message is None:
                raise
            raise exit_with(command, ValueError(message)) from None

    def checked(argv: list[str]) -> Any:
        try:
            return main(argv)
        except app.UsageError as e:
            raise exit_with(command, e) from None

    app.run(checked, flags_parser=parse)


def _unknown_override(argv: Sequence[str], error: BaseException) -> str | None:
    """`--config.<path>: no field <name> in the config (<ml_collections' hint>)` for ml_collections' error
    of an override whose path names no field (KeyError, wrapped in AttributeError, its first line the field
    name in quotes); None where argv holds no `--config.` override."""
    overrides = [arg.split("=", 1)[0].lstrip("-") for arg in argv[1:] if re.match(r"--?(no)?config\.", arg)]
    if not overrides:
        return None
    while error.args and isinstance(error.args[0], BaseException):
        error = error.args[0]
    lines = [line.strip() for line in str(error.args[0] if error.args else error).splitlines() if line.strip()]
    field = lines[0].strip("'\"") if lines else ""
    named = [o for o in overrides if field in re.split(r"[.\[\]]", o)[1:]] or overrides
    hint = f" ({' '.join(lines[1:])})" if len(lines) > 1 else ""
    return f"--{named[0]}: no field {field!r} in the config{hint}"


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser whose errors (an unknown command or option, a missing required argument, a bad
    value) end the command as `exit_with` does: one line `<command>: <argparse's message>` on stderr, exit
    status 1, instead of argparse's usage lines and exit status 2. `<command>` is `prog` without
    "python -m bert_jax." and its packages ("convert", "convert from_hf"); subparsers are of this class too.
    """

    def error(self, message: str):
        command = re.sub(r"^python -m (\w+\.)*", "", self.prog)
        raise exit_with(command, ValueError(message))
