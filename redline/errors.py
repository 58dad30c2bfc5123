"""The one exception type that means "the user gave us something wrong".

The CLI prints such an error as a single line (no traceback) and exits with status 2.
Everything else is a bug and keeps its traceback.
"""


class UserError(Exception):
    """Bad input: the message names what is wrong and how to fix it."""
