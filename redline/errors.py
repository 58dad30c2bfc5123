"""The one exception type that means "the user gave us something wrong".

The CLI prints such an error as a single line (no traceback) and exits with status 2.
Everything else is a bug and keeps its traceback.
"""


class UserError(Exception):
    """Bad input: the message names what is wrong and how to fix it."""


def one_line(error: BaseException) -> str:
    """A parser's error message on one line. YAML's errors span several lines (the problem, then the source line
    with a caret under the column): they become "PROBLEM (line L, column C)"."""
    problem, mark = getattr(error, "problem", None), getattr(error, "problem_mark", None)
    if problem and mark is not None:
        return f"{problem} (line {mark.line + 1}, column {mark.column + 1})"
    return " ".join(str(error).split())


def read_text_file(path, what: str) -> str:
    """The text of a file the user gave (a recipe, a claims file), or one line saying why it cannot be read."""
    from pathlib import Path

    try:
        return Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{what} {path} is not UTF-8 text (byte {e.start} cannot be decoded); "
                        "save it as UTF-8") from None
    except OSError as e:
        raise UserError(f"cannot read {what} {path} ({e.strerror or e})") from None
