"""Errors that reach the user as one clear sentence and exit code 2 (never a traceback)."""

# Rule: a message quotes a user's value through `shown`, so a megabyte-long name stays a one-line message.
ECHO_LIMIT = 100


class UserError(Exception):
    """Bad input: the message names the file, object or field and says how to fix it."""

    exit_code = 2


def shown(value: object, limit: int = ECHO_LIMIT, quoted: bool = True) -> str:
    """`value` as a message quotes it (its repr; a str as it is when not `quoted`), cut to `limit` characters
    with an ellipsis and the full length."""
    text = repr(value) if quoted or not isinstance(value, str) else value
    if len(text) <= limit:
        return text
    length = len(value) if isinstance(value, str) else len(text)
    return f"{text[:limit]}… ({length} characters)"
