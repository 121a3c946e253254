"""Errors that reach the user as one clear sentence and exit code 2 (never a traceback)."""


class UserError(Exception):
    """Bad input: the message names the file, object or field and says how to fix it."""

    exit_code = 2
