"""The limits of every input autopar reads, in one place, and the helpers that enforce them.

Every loader (JSON, YAML, TOML files, ``config.json``, ``--from-json``, ``--from-raw``) and every
integer flag parses integers through :func:`int_literal`: a literal of more than
:data:`MAX_INT_DIGITS` digits is refused with one line, before Python's own 4,300-digit guard
would raise a traceback. Sizes and counts are bounded by the constants below (the message names
the bound). Names and paths that reach the terminal go through :func:`terminal_safe` (control
characters, ESC and newlines written as escapes, so an error stays one line and a file name cannot
drive the terminal) and, where rich renders them, :func:`markup_safe` (``[bold]`` shown as text).

This module imports only the standard library: ``import autopar`` stays light.
"""

from __future__ import annotations

from collections.abc import Callable

# --------------------------------------------------------------------------------------- files
MAX_INPUT_BYTES = 64 * 1024 * 1024  # no configuration, layout or calibration file comes near this
MAX_CONFIG_BYTES = 1 << 20  # a model config.json (the largest seen is ~30 KB: Phi-3 long-RoPE lists)
MAX_EXPANDED_NODES = 1_000_000  # values a YAML document may expand to through its aliases
MAX_INT_DIGITS = 30  # digits of one integer literal in a file or a flag (2**64 has 20)

# ---------------------------------------------------------------------------------- jobs (training)
MAX_NUM_DEVICES = 2**20
MAX_SEQ_LEN = 2**24
MAX_GLOBAL_BATCH = 2**24

# ------------------------------------------------------------------------ serving and generation
MAX_SERVE_DEVICES = 16_384  # devices of one serving deployment (memory grows with the count)
MAX_PIXELS = 16384  # pixels per side of a generated image or video
MAX_FRAMES = 4096
MAX_STEPS = 10000
MAX_DIT_LAYERS = 1024  # transformer blocks of a DiT config (the largest published has 60)
MAX_DIT_WIDTH = 65_536  # hidden width / heads x head_dim of a DiT config

# ------------------------------------------------------------------------------ grids and searches
MAX_SWEEP_POINTS = 10_000  # jobs in one `autopar sweep` grid
MAX_COMPARE_CELLS = 1_000  # models x devices x lengths x batches of one `compare` (a search each)
MAX_WHATIF_POINTS = 10_000  # hardware points of one `whatif` grid (~0.5 ms each: seconds, not hours)
MAX_TOP = 10_000  # results a command lists
MAX_WORKERS = 256  # scoring processes
MAX_SEED = 2**32 - 1  # numpy's seed range (Optuna samplers seed a RandomState)
MAX_LOCAL_RANKS = 256  # processes one local torchrun launch may start (calibrate, validate)

# ---------------------------------------------------------------------------------------- names
MAX_NAME_CHARS = 200  # a study, space or calibration name
MAX_ECHO_CHARS = 120  # characters of a user's value quoted back in one error line
MAX_MESSAGE_CHARS = 1_000  # an error line's message (and as much for its hint): a value it quotes is cut
RAY_CONNECT_TIMEOUT_S = 10.0  # a Ray address that does not answer within this is refused


class IntegerTooLong(ValueError):
    """An integer literal over :data:`MAX_INT_DIGITS` digits (a ValueError, like ``int()``'s)."""

    def __init__(self, text: str) -> None:
        digits = len(text.strip().lstrip("+-").replace("_", ""))
        super().__init__(f"an integer literal has {digits:,} digits, more than the {MAX_INT_DIGITS} allowed")


def int_literal(text: str) -> int:
    """``int(text)`` for a decimal literal of at most :data:`MAX_INT_DIGITS` digits.

    Longer literals raise :class:`IntegerTooLong` (Python's own limit, 4,300 digits, would raise
    a bare ValueError; below it a 4,000-digit number would be accepted and break arithmetic later).
    """
    body = text.strip().lstrip("+-").replace("_", "")
    if len(body) > MAX_INT_DIGITS and body.isdigit():
        raise IntegerTooLong(body)
    return int(text)


def json_int(where: str, error: Callable[[str, str], Exception]) -> Callable[[str], int]:
    """A ``parse_int`` for :func:`json.loads` that raises ``error(message, hint)`` on a long literal
    (the message starts with ``where``, when given)."""

    def parse(text: str) -> int:
        try:
            return int_literal(text)
        except IntegerTooLong as exc:
            raise error(
                f"{where}: {exc}" if where else str(exc), "write a number of a sensible size"
            ) from None

    return parse


# ------------------------------------------------------------------------------------ terminal
def terminal_safe(text: object, limit: int | None = None) -> str:
    """``text`` as one printable line: every character ``str.isprintable`` refuses (newline, ESC
    and other control characters, lone surrogates from an undecodable file name, line and paragraph
    separators) is written as its Python escape (``\\n``, ``\\x1b``, ``\\udcff``); over ``limit``
    characters, the middle is cut and replaced by ``...``."""
    s = str(text)
    if not s.isprintable():
        s = "".join(c if c.isprintable() else repr(c)[1:-1] for c in s)
    if limit is not None and len(s) > limit:
        keep = max(limit - 3, 2)
        s = s[: keep - keep // 3] + "..." + s[len(s) - keep // 3 :]
    return s


def markup_safe(text: object, limit: int | None = None) -> str:
    """:func:`terminal_safe`, then rich markup escaped: ``[bold]`` or ``[/]`` in a name prints as
    written instead of being applied (or raising rich's MarkupError)."""
    from rich.markup import escape

    return escape(terminal_safe(text, limit))


def echo(text: object) -> str:
    """A user's value quoted in an error: ``repr``-like, one line, at most :data:`MAX_ECHO_CHARS`."""
    return terminal_safe(repr(text), MAX_ECHO_CHARS)


def check_count(value: int, bound: int, what: str, hint: str, error: Callable[[str, str], Exception]) -> int:
    """``value`` if it is at most ``bound``; else ``error`` naming both."""
    if value > bound:
        raise error(f"{what} is {value:,}, over the limit of {bound:,}", hint)
    return value
