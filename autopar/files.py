"""Every file autopar reads or writes goes through here: one set of rules, one kind of error.

Reading (:func:`read_text`, :func:`load_json`, :func:`load_yaml`, :func:`load_toml`,
:func:`load_structured`): the path must be an existing regular file (a directory, FIFO, device or
socket is refused: reading a FIFO would block), at most :data:`MAX_INPUT_BYTES`, UTF-8 text (a
binary or undecodable file is refused with the offset of the first bad byte). JSON and YAML
mappings may not repeat a key (TOML refuses that itself), and JSON's non-standard ``NaN`` /
``Infinity`` are refused. :func:`validation_message` turns a pydantic error into one line naming
the file, the field and, for an unknown key, the keys that are allowed.

Writing (:func:`check_output`, :func:`write_text`, :func:`atomic_path`): the destination is checked
before any long work starts (commands call :func:`check_output` first). A symlink is followed and
its target written (the link stays a link); an existing directory, FIFO, device or socket is
refused; the parent directory must already exist (it is never created silently: the error says
``mkdir -p DIR``). The text goes to a temporary file in the same directory, is flushed and
fsynced, gets the mode of the file it replaces (or 0666 less the umask for a new one) and is
renamed over the destination: a reader sees the old file or the complete new one, and on any
failure the old file is intact and no temporary file is left.

No output replaces an input of the same command or another of its outputs
(:func:`check_distinct`, run by the CLI for every command before its handler: real paths are
compared, and existing files by device and inode, so a symlink or a hard link is seen through).

Every refusal is a :class:`~autopar.errors.FileError` (exit status 2, one line).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, get_args, get_origin

from autopar.errors import FileError
from autopar.limits import (
    MAX_EXPANDED_NODES,
    MAX_INPUT_BYTES,
    MAX_INT_DIGITS,
    IntegerTooLong,
    json_int,
    terminal_safe,
)

__all__ = [
    "MAX_INPUT_BYTES",
    "read_text",
    "parse_json",
    "parse_yaml",
    "parse_toml",
    "load_json",
    "load_yaml",
    "load_toml",
    "load_structured",
    "validation_message",
    "check_output",
    "write_text",
    "atomic_path",
    "check_study_name",
    "check_distinct",
    "command_paths",
]


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


# ---------------------------------------------------------------------------------------- reading
def read_text(path: str | os.PathLike[str], what: str, hint: str, *, max_bytes: int = MAX_INPUT_BYTES) -> str:
    """The UTF-8 text of the regular file ``path``; ``what`` names it in errors, ``hint`` says what to pass."""
    p = Path(path).expanduser()
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise FileError(f"{what} {p} does not exist", hint) from None
    except NotADirectoryError:
        raise FileError(f"{what} {p} does not exist (a parent is not a directory)", hint) from None
    except OSError as exc:
        raise FileError(f"{what} {p} cannot be read: {exc.strerror}", hint) from None
    if not stat.S_ISREG(st.st_mode):
        raise FileError(f"{what} {p} is {_kind(st.st_mode)}, not a regular file", hint)
    if st.st_size > max_bytes:
        raise FileError(
            f"{what} {p} is {st.st_size / 2**20:.1f} MiB, over the {max_bytes / 2**20:.0f} MiB limit for input files",
            hint,
        )
    try:
        with open(p, "rb") as fh:
            data = fh.read(max_bytes + 1)
    except OSError as exc:
        raise FileError(f"{what} {p} cannot be read: {exc.strerror}", hint) from None
    if len(data) > max_bytes:
        raise FileError(f"{what} {p} is over the {max_bytes / 2**20:.0f} MiB limit for input files", hint)
    nul = data.find(b"\x00")
    if nul >= 0:
        raise FileError(f"{what} {p} is a binary file (NUL byte at offset {nul}), not text", hint)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise FileError(
            f"{what} {p} is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})", hint
        ) from None


def _no_duplicates(where: str) -> Callable[[list[tuple[str, Any]]], dict[str, Any]]:
    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in pairs:
            if k in out:
                raise FileError(f"{where}: key {k!r} appears twice in one object", "keep one of them")
            out[k] = v
        return out

    return hook


def _no_constant(where: str) -> Callable[[str], Any]:
    def refuse(name: str) -> Any:
        raise FileError(f"{where}: {name} is not a number JSON allows", "write a finite number")

    return refuse


def parse_json(text: str, where: str) -> Any:
    """JSON with duplicate keys, NaN/Infinity and over-long integers (:mod:`autopar.limits`) refused;
    ``where`` prefixes every error."""
    try:
        return json.loads(
            text,
            object_pairs_hook=_no_duplicates(where),
            parse_constant=_no_constant(where),
            parse_int=json_int(where, FileError),
        )
    except json.JSONDecodeError as exc:
        raise FileError(
            f"{where}: not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})",
            "fix the JSON syntax",
        ) from None
    except RecursionError:
        raise FileError(f"{where}: JSON nested too deeply", "flatten the file") from None


def _yaml_loader() -> Any:
    import yaml

    base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

    class Loader(base):  # type: ignore[misc, valid-type]
        """SafeLoader that refuses a key repeated in one mapping (PyYAML keeps the last silently)."""

    def construct_mapping(self: Any, node: Any, deep: bool = False) -> Any:
        if isinstance(node, yaml.MappingNode):
            self.flatten_mapping(node)
            seen: dict[Any, Any] = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                try:
                    dup = key in seen
                except TypeError:  # an unhashable key: let the base constructor report it
                    break
                if dup:
                    mark = key_node.start_mark
                    raise yaml.constructor.ConstructorError(
                        None, None, f"key {key!r} appears twice in one mapping", mark
                    )
                seen[key] = True
        return base.construct_mapping(self, node, deep=deep)

    def construct_int(self: Any, node: Any) -> Any:
        body = str(node.value).strip().lstrip("+-").replace("_", "")
        if len(body) > MAX_INT_DIGITS:  # Python's int() would raise past 4,300 digits, a traceback
            mark = node.start_mark
            raise _LongInteger(None, None, str(IntegerTooLong(body)), mark)
        return base.construct_yaml_int(self, node)

    class _LongInteger(yaml.constructor.ConstructorError):
        pass

    Loader.long_integer = _LongInteger
    Loader.construct_mapping = construct_mapping  # type: ignore[method-assign]
    Loader.add_constructor("tag:yaml.org,2002:int", construct_int)
    return Loader


_LOADER: Any = None


def parse_yaml(text: str, where: str) -> Any:
    """YAML (safe subset) with repeated keys refused; ``where`` prefixes every error."""
    import yaml

    global _LOADER
    if _LOADER is None:
        _LOADER = _yaml_loader()
    try:
        data = yaml.load(text, Loader=_LOADER)  # noqa: S506 - a SafeLoader subclass
        _check_expanded_size(data, where)
        return data
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        if isinstance(exc, _LOADER.long_integer):
            raise FileError(f"{where}{at}: {problem}", "write a number of a sensible size") from None
        raise FileError(f"{where}: not valid YAML{at}: {problem}", "fix the YAML syntax") from None
    except RecursionError:
        raise FileError(f"{where}: YAML nested too deeply", "flatten the file") from None


def _check_expanded_size(data: Any, where: str) -> None:
    """Refuse a recursive document or one whose aliases expand it past MAX_EXPANDED_NODES values
    (a "billion laughs" file is a few hundred bytes that every consumer would walk in full)."""
    sizes: dict[int, int] = {}
    active: set[int] = set()

    def size(x: Any) -> int:
        if not isinstance(x, dict | list):
            return 1
        k = id(x)
        if k in sizes:
            return sizes[k]
        if k in active:
            raise FileError(f"{where}: the document refers to itself (a recursive alias)", "remove the alias")
        active.add(k)
        items = list(x.keys()) + list(x.values()) if isinstance(x, dict) else x
        n = 1
        for v in items:
            n += size(v)
            if n > MAX_EXPANDED_NODES:
                raise FileError(
                    f"{where}: the document expands to more than {MAX_EXPANDED_NODES:,} values through its aliases",
                    "write the values out instead of nesting aliases",
                )
        active.discard(k)
        sizes[k] = n
        return n

    size(data)


def parse_toml(text: str, where: str) -> Any:
    import tomllib

    try:
        data = tomllib.loads(text)
    except ValueError as exc:  # tomllib calls int(): a literal past Python's 4,300 digits
        if not isinstance(exc, tomllib.TOMLDecodeError):
            digits = max((len(m) for m in re.findall(r"[0-9_]+", text)), default=0)
            raise FileError(
                f"{where}: an integer literal has {digits:,} digits, more than the {MAX_INT_DIGITS} allowed",
                "write a number of a sensible size",
            ) from None
        raise FileError(
            f"{where}: not valid TOML: {str(exc).splitlines()[0]}", "fix the TOML syntax"
        ) from None
    except RecursionError:
        raise FileError(f"{where}: TOML nested too deeply", "flatten the file") from None
    _check_int_sizes(data, where)
    return data


def _check_int_sizes(data: Any, where: str) -> None:
    """Refuse an integer of more than MAX_INT_DIGITS digits anywhere in ``data`` (TOML has no int hook)."""
    stack = [data]
    while stack:
        x = stack.pop()
        if isinstance(x, dict):
            stack.extend(x.values())
        elif isinstance(x, list):
            stack.extend(x)
        elif isinstance(x, int) and not isinstance(x, bool) and abs(x) >= 10**MAX_INT_DIGITS:
            raise FileError(
                f"{where}: an integer has more than the {MAX_INT_DIGITS} digits allowed",
                "write a number of a sensible size",
            )


def load_json(path: str | os.PathLike[str], what: str, hint: str) -> Any:
    return parse_json(read_text(path, what, hint), f"{what} {path}")


def load_yaml(path: str | os.PathLike[str], what: str, hint: str) -> Any:
    return parse_yaml(read_text(path, what, hint), f"{what} {path}")


def load_toml(path: str | os.PathLike[str], what: str, hint: str) -> Any:
    return parse_toml(read_text(path, what, hint), f"{what} {path}")


def load_structured(path: str | os.PathLike[str], what: str, hint: str, *, default: str = "yaml") -> Any:
    """JSON, YAML or TOML chosen by the suffix (``.json``, ``.yaml``/``.yml``, ``.toml``; else ``default``)."""
    text = read_text(path, what, hint)
    suffix = Path(path).suffix.lower()
    kind = {".json": "json", ".yaml": "yaml", ".yml": "yaml", ".toml": "toml"}.get(suffix, default)
    where = f"{what} {path}"
    parsed = {"json": parse_json, "yaml": parse_yaml, "toml": parse_toml}[kind](text, where)
    return parsed


def require_mapping(data: Any, where: str, hint: str, *, empty_ok: bool = False) -> dict[str, Any]:
    """``data`` as a dict with string keys; an empty file or a list/scalar is refused."""
    if data is None or (data == {} and not empty_ok):
        raise FileError(f"{where} is empty", hint)
    if not isinstance(data, dict):
        raise FileError(f"{where}: expected a mapping at the top level, got {type(data).__name__}", hint)
    bad = [k for k in data if not isinstance(k, str)]
    if bad:
        raise FileError(f"{where}: keys must be strings, got {bad[0]!r}", hint)
    return data


# ------------------------------------------------------------------------------ validation errors
def _allowed_keys(model: Any, loc: tuple[Any, ...]) -> list[str] | None:
    """The keys the pydantic model at ``loc`` (a path into ``model``) accepts."""
    from pydantic import BaseModel

    t: Any = model
    parts = list(loc)
    while parts:
        origin = get_origin(t)
        if origin is not None and origin not in (dict, list, tuple):  # Union / Annotated / Optional
            models = [a for a in get_args(t) if isinstance(a, type) and issubclass(a, BaseModel)]
            others = [a for a in get_args(t) if a is not type(None)]
            t = models[0] if models else (others[0] if others else None)
            continue
        part = parts.pop(0)
        if isinstance(t, type) and issubclass(t, BaseModel):
            field = None
            for name, info in t.model_fields.items():
                if part in (name, info.alias):
                    field = info
                    break
            if field is None:
                return None
            t = field.annotation
        elif origin is dict:
            t = get_args(t)[1] if get_args(t) else None
        elif origin in (list, tuple):
            t = get_args(t)[0] if get_args(t) else None
        else:
            return None
    while get_origin(t) is not None and get_origin(t) not in (dict, list, tuple):
        models = [a for a in get_args(t) if isinstance(a, type) and issubclass(a, BaseModel)]
        t = models[0] if models else None
    if isinstance(t, type) and issubclass(t, BaseModel):
        return sorted(info.alias or name for name, info in t.model_fields.items())
    return None


def validation_message(exc: Any, where: str, model: Any = None) -> str:
    """One line for a pydantic ``ValidationError``: the file, the field path, what is wrong.

    An unknown key lists the keys allowed there (when ``model``, the validated class, is given).
    """
    errors = exc.errors()
    # An unknown key first: a misspelt key also makes the real one "missing", and the typo is the news.
    err = next((e for e in errors if e.get("type") == "extra_forbidden"), errors[0])
    loc = tuple(err.get("loc") or ())
    path = ".".join(str(x) for x in loc) or "<top level>"
    more = f" (and {len(errors) - 1} more problem(s))" if len(errors) > 1 else ""
    if err.get("type") == "extra_forbidden":
        allowed = _allowed_keys(model, loc[:-1]) if model is not None else None
        tail = f"; allowed keys: {', '.join(allowed)}" if allowed else ""
        return f"{where}: unknown key {path!r}{tail}{more}"
    if err.get("type") == "missing":
        return f"{where}: required key {path!r} is missing{more}"
    msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
    value = err.get("input")
    got = "" if isinstance(value, dict | list) else f", got {value!r}"
    if len(got) > 80:
        got = got[:77] + "..."
    return f"{where}: {path}: {msg}{got}{more}"


def finite_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


# ---------------------------------------------------------------------------------------- writing
def check_output(path: str | os.PathLike[str], what: str, flag: str) -> Path:
    """The regular file that writing ``path`` will create or replace (a symlink: its target).

    Refuses (FileError) an empty path, an existing directory / FIFO / device / socket, a missing
    or non-directory parent, and an unwritable file or directory. Call it before any long work.
    """
    if str(path).strip() == "":
        raise FileError(f"{flag} is empty", f"pass a file path for the {what}")
    _check_utf8_name(path, flag)
    p = Path(path).expanduser()
    target = Path(os.path.realpath(p))  # a symlink (chain) is followed to the file it names
    via = f" (the target of symlink {p})" if target != Path(os.path.abspath(p)) else ""
    try:
        st = os.stat(target)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise FileError(f"{flag} {p}: cannot check {target}: {exc.strerror}", "pass another path") from None
    if st is not None:
        if stat.S_ISDIR(st.st_mode):
            raise FileError(
                f"{flag} {p} is a directory{via}", f"pass a file path for the {what}, e.g. {p / 'out'}"
            )
        if not stat.S_ISREG(st.st_mode):
            raise FileError(
                f"{flag} {p} is {_kind(st.st_mode)}{via}; autopar writes only regular files",
                f"pass a regular file path for the {what}",
            )
        if not os.access(target, os.W_OK):
            raise FileError(f"{flag} {p} is not writable{via}", "change its permissions or pass another path")
    parent = target.parent
    try:
        pst = os.stat(parent)
    except FileNotFoundError:
        raise FileError(
            f"{flag} {p}: directory {parent} does not exist{via}",
            f"create it first (mkdir -p {parent}) or pass another path",
        ) from None
    except OSError as exc:
        raise FileError(
            f"{flag} {p}: directory {parent} cannot be used: {exc.strerror}", "pass another path"
        ) from None
    if not stat.S_ISDIR(pst.st_mode):
        raise FileError(f"{flag} {p}: {parent} is not a directory{via}", "pass a path inside a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise FileError(
            f"{flag} {p}: directory {parent} is not writable{via}", "pass a path in a directory you can write"
        )
    return target


def _check_utf8_name(path: str | os.PathLike[str], flag: str) -> None:
    """A name that is not UTF-8 (its bytes reach Python as lone surrogates) cannot be written into
    a report or a JSON record: refused before any work, with the name escaped."""
    try:
        os.fspath(path).encode("utf-8")
    except UnicodeEncodeError:
        raise FileError(
            f"{flag} {terminal_safe(os.fspath(path))} is not a UTF-8 file name", "pass a UTF-8 name"
        ) from None


def check_output_dir(path: str | os.PathLike[str], flag: str) -> Path:
    """An existing, writable directory for several outputs (never created silently)."""
    if str(path).strip() == "":
        raise FileError(f"{flag} is empty", "pass a directory")
    _check_utf8_name(path, flag)
    p = Path(path).expanduser()
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise FileError(
            f"{flag} {p} does not exist", f"create it first (mkdir -p {p}) or pass another directory"
        ) from None
    except OSError as exc:
        raise FileError(f"{flag} {p} cannot be used: {exc.strerror}", "pass another directory") from None
    if not stat.S_ISDIR(st.st_mode):
        raise FileError(f"{flag} {p} is {_kind(st.st_mode)}, not a directory", "pass a directory")
    if not os.access(p, os.W_OK | os.X_OK):
        raise FileError(f"{flag} {p} is not writable", "pass a directory you can write")
    return Path(os.path.realpath(p))


def _new_file_mode(target: Path) -> int:
    try:
        return stat.S_IMODE(os.stat(target).st_mode)  # replacing a file keeps its mode
    except OSError:
        mask = os.umask(0)
        os.umask(mask)
        return 0o666 & ~mask


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str], what: str, flag: str) -> Iterator[Path]:
    """A temporary path next to ``path`` to write; renamed over it when the block succeeds.

    The destination is checked first (:func:`check_output`); on any error the temporary file is
    removed, the old file is left as it was, and an OSError becomes a FileError.
    """
    target = check_output(path, what, flag)
    try:
        fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as exc:
        raise FileError(
            f"{flag} {path}: cannot write in {target.parent}: {exc.strerror}", "pass another path"
        ) from None
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.chmod(tmp, _new_file_mode(target))
        os.replace(tmp, target)
        with contextlib.suppress(OSError):  # make the rename durable (best effort)
            dfd = os.open(target.parent, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise FileError(
            f"{flag} {path}: cannot write {target}: {exc.strerror}", "pass another path"
        ) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text(
    path: str | os.PathLike[str],
    text: str,
    what: str,
    flag: str,
    *,
    check: Callable[[Path], Any] | None = None,
) -> Path:
    """Write ``text`` to ``path`` atomically (see the module docs); ``check(tmp)`` may veto it."""
    target = check_output(path, what, flag)
    with atomic_path(target, what, flag) as tmp:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
        if check is not None:
            check(tmp)
    return target


# ------------------------------------------------------------------------------------------ names
def check_study_name(name: str, flag: str = "--name") -> str:
    """A study name: non-empty, printable, one line, at most 200 characters."""
    if not name or not name.strip():
        raise FileError(f"{flag} is empty", "give the study a name, e.g. --name llama70b-h100")
    bad = [c for c in name if not c.isprintable()]
    if bad:
        raise FileError(
            f"{flag} {name!r} contains a control character ({bad[0]!r})", "use a one-line printable name"
        )
    if name != name.strip():
        raise FileError(f"{flag} {name!r} starts or ends with spaces", "drop the surrounding spaces")
    if len(name) > 200:
        raise FileError(f"{flag} is {len(name)} characters long", "use at most 200 characters")
    return name


# ---------------------------------------------------------------------------------- same paths
# argparse destinations that name files a command reads (when such a file exists: ``--model`` and
# ``--device`` are also preset ids) and those that name files it writes.
INPUT_DESTS = (
    "model",
    "device",
    "calibration",
    "space",
    "from_json",
    "from_raw",
    "layouts",
    "file",
    "storage",
)
OUTPUT_DESTS = ("out", "html", "json", "refit", "save_raw")
_DEFAULT_STORAGE = "autopar-studies.log"  # autopar.search.study.DEFAULT_STORAGE, without importing it


def command_paths(a: Any) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """The ``(flag, path)`` inputs and outputs an ``autopar`` command line names.

    ``--json`` counts only where it takes a path (``validate``); ``compare --out PREFIX`` writes
    ``PREFIX.csv`` and ``PREFIX.svg``; ``calibrate`` writes ``<out-dir>/<name>.yaml`` and
    ``<name>.device.yaml``; a study command reads its storage (default ``autopar-studies.log``).
    """
    ns = vars(a)
    inputs: list[tuple[str, str]] = []
    outputs: list[tuple[str, str]] = []
    for dest in INPUT_DESTS:
        if dest not in ns:
            continue
        v = ns[dest]
        if v is None and dest == "storage" and (ns.get("command") == "study" or ns.get("study")):
            v = _DEFAULT_STORAGE
        if isinstance(v, str | os.PathLike) and str(v) not in ("", "-") and "://" not in str(v):
            inputs.append((f"--{dest.replace('_', '-')}" if dest != "file" else "FILE", str(v)))
    for dest in OUTPUT_DESTS:
        v = ns.get(dest)
        if not isinstance(v, str | os.PathLike) or str(v).strip() in ("", "-"):
            continue
        flag = f"--{dest.replace('_', '-')}"
        if dest == "out" and ns.get("command") == "compare":
            outputs += [(flag, f"{v}.csv"), (flag, f"{v}.svg")]
        else:
            outputs.append((flag, str(v)))
    if ns.get("command") == "calibrate":
        name = ns.get("name")
        out_dir = ns.get("out_dir") or "autopar-calibration"
        if isinstance(name, str) and name and "/" not in name:
            outputs += [("--out-dir", os.path.join(out_dir, f"{name}.yaml"))]
            outputs += [("--out-dir", os.path.join(out_dir, f"{name}.device.yaml"))]
    return inputs, outputs


def _identity(path: str) -> tuple[Any, ...]:
    """What makes two paths one file: (device, inode) when it exists, else its real path."""
    p = os.path.expanduser(path)
    try:
        st = os.stat(p)
        if stat.S_ISREG(st.st_mode):
            return ("inode", st.st_dev, st.st_ino)
    except OSError:
        pass
    return ("path", os.path.realpath(p))


def check_distinct(inputs: list[tuple[str, str]], outputs: list[tuple[str, str]]) -> None:
    """Refuse an output that is an input or another output of the same command (FileError).

    Inputs that do not exist are not files (a preset id, a built-in space name) and are skipped.
    Symlinks and hard links are seen through. Only ``stat`` calls: run it before any work.
    """
    seen: dict[tuple[Any, ...], tuple[str, str]] = {}
    for flag, path in inputs:
        p = os.path.expanduser(path)
        if os.path.isfile(p):
            seen.setdefault(_identity(p), (flag, path))
    for flag, path in outputs:
        key = _identity(path)
        other = seen.get(key)
        if other is not None:
            oflag, opath = other
            role = "an input" if (oflag, opath) in inputs else "another output"
            given = {os.path.abspath(os.path.expanduser(x)) for x in (path, opath)}
            same = " (through a link)" if len(given) > 1 else ""
            raise FileError(
                f"{flag} {path} is the same file as {oflag} {opath}{same}: writing it would replace {role} "
                "of this command",
                f"write {flag} to another path",
            )
        seen[key] = (flag, path)
