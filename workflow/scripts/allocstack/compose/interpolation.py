"""Compose's variable interpolation, as ``docker compose`` does it: ``$VAR``, ``${VAR}``, ``${VAR:-default}``,
``${VAR-default}``, ``${VAR:?message}``, ``${VAR?message}``, ``${VAR:+replacement}``, ``${VAR+replacement}``,
``$$`` for a literal ``$``; a default may itself hold ``${...}``.

Where the values come from, as Compose takes them: the environment the import runs in first, then the
``.env`` file beside the (first) Compose file, or instead of it the ``--env-file`` files in order (a later
one overrides an earlier one). What the import differs in, on purpose:

* a variable with neither a value nor a default is refused naming it (Compose would warn and use "");
* ``${ALLOCSTACK_...}`` is left as written: allocstack replaces those names itself when it starts a
  program (see allocstack/launch/program.py);
* a value taken from the environment whose name looks secret (PASSWORD, TOKEN, SECRET, KEY) is never
  written out: the interpolation leaves a marker (:func:`secret_marker`) that the import writes as
  ``${env:NAME}``, read from the environment when the program starts.

Pure: no I/O but :func:`read_env_file`, which reads one file.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: A name that looks like it holds a secret: its value from the environment is never written in a file.
SECRET_NAME = re.compile(r"PASSWORD|PASSWD|TOKEN|SECRET|KEY", re.IGNORECASE)
#: The operators of ``${NAME<op>word}``, longest first.
OPERATORS = (":-", ":?", ":+", "-", "?", "+")
#: allocstack's own names, left for allocstack to replace when it starts a program.
OWN_PREFIX = "ALLOCSTACK_"
#: How a value read from the environment at run time is written in the config (allocstack/launch/program.py).
ENV_REFERENCE = re.compile(r"\$\{env:([A-Za-z_][A-Za-z0-9_]*)\}")
_MARKER = re.compile(r"\x00env:([A-Za-z_][A-Za-z0-9_]*)\x00")


def secret_marker(name: str) -> str:
    """Where a secret from the environment stood in a value, until the import decides how to write it."""
    return f"\x00env:{name}\x00"


def markers(text: str) -> list[str]:
    """The names of the secrets from the environment in ``text``."""
    return _MARKER.findall(text)


def as_references(text: str) -> str:
    """``text`` with each secret marker written as ``${env:NAME}`` (read from the environment at run time)."""
    return _MARKER.sub(lambda match: f"${{env:{match.group(1)}}}", text)


def looks_secret(name: str) -> bool:
    return bool(SECRET_NAME.search(name))


class InterpolationError(ValueError):
    """A ``${...}`` that is not Compose's syntax, or a required variable that is not set."""


@dataclass
class Use:
    """One variable the Compose file uses: where its value came from, and where it is used."""

    name: str
    source: str  # "the environment", ".env", "--env-file FILE", "default", "not set"
    secret: bool = False  # from the environment with a secret-looking name: referenced, not written
    where: list[str] = field(default_factory=list)


class Variables:
    """The values interpolation reads: the environment over the env files (each later file over earlier ones)."""

    def __init__(self, environ: Mapping[str, str], files: list[tuple[str, dict[str, str]]]) -> None:
        self.environ = environ
        self.files = files

    def lookup(self, name: str) -> tuple[str, str] | None:
        """``(value, source)``, or None when ``name`` is set nowhere."""
        if name in self.environ:
            return self.environ[name], "the environment"
        for label, values in reversed(self.files):
            if name in values:
                return values[name], label
        return None


class Interpolator:
    """Interpolates the strings of a Compose document; records each variable's source in :attr:`uses`
    and each problem (a required or unset variable, bad syntax) in :attr:`problems` as (where, message)."""

    def __init__(self, variables: Variables) -> None:
        self.variables = variables
        self.uses: dict[str, Use] = {}
        self.problems: list[tuple[str, str]] = []

    def document(self, node: Any, where: str = "") -> Any:
        """Every string value of ``node`` interpolated (mapping keys are not, as in Compose)."""
        if isinstance(node, dict):
            return {key: self.document(value, f"{where}.{key}" if where else str(key)) for key, value in node.items()}
        if isinstance(node, list):
            return [self.document(item, f"{where}[{index}]") for index, item in enumerate(node)]
        if isinstance(node, str):
            try:
                return self.text(node, where)
            except InterpolationError as error:
                self.problems.append((where, str(error)))
                return node
        return node

    def text(self, text: str, where: str) -> str:
        """One string interpolated.

        :raises InterpolationError: a ``${`` that is not closed or holds no variable name, or a variable that
            ``${NAME:?message}`` requires.
        """
        out: list[str] = []
        index = 0
        while index < len(text):
            dollar = text.find("$", index)
            if dollar < 0:
                out.append(text[index:])
                break
            out.append(text[index:dollar])
            following = text[dollar + 1:dollar + 2]
            if following == "$":
                out.append("$")
                index = dollar + 2
            elif following == "{":
                end = closing_brace(text, dollar + 2)
                if end < 0:
                    raise InterpolationError(f"invalid interpolation format {text[dollar:]!r}: no closing '}}'")
                out.append(self.braced(text[dollar + 2:end], text[dollar:end + 1], where))
                index = end + 1
            elif match := NAME.match(text, dollar + 1):
                out.append(self.value_of(match.group(0), where, None))
                index = match.end()
            else:  # a lone $ is kept, as Compose keeps it
                out.append("$")
                index = dollar + 1
        return "".join(out)

    def braced(self, inside: str, written: str, where: str) -> str:
        match = NAME.match(inside)
        if not match:
            raise InterpolationError(f"invalid interpolation format {written!r}: no variable name")
        name, rest = match.group(0), inside[match.end():]
        if not rest:
            if name.startswith(OWN_PREFIX):
                return written  # allocstack's own: replaced when the program starts
            return self.value_of(name, where, None)
        operator = next((op for op in OPERATORS if rest.startswith(op)), None)
        if operator is None:
            raise InterpolationError(f"invalid interpolation format {written!r}")
        word = rest[len(operator):]
        found = self.variables.lookup(name)
        present = found is not None and (found[0] != "" or ":" not in operator)
        if operator in (":-", "-"):
            if present:
                return self.value_of(name, where, found)
            self.record(name, "default" if found is None else f"default ({name} is empty)", where)
            return self.text(word, where)
        if operator in (":?", "?"):
            if present:
                return self.value_of(name, where, found)
            self.record(name, "not set", where)
            message = self.text(word, where) or "required"
            raise InterpolationError(f"${{{name}}} is required but {'empty' if found else 'not set'}: {message}")
        self.record(name, found[1] if found else "not set", where)
        return self.text(word, where) if present else ""

    def value_of(self, name: str, where: str, found: tuple[str, str] | None) -> str:
        found = found or self.variables.lookup(name)
        if found is None:
            self.record(name, "not set", where)
            raise InterpolationError(f"variable {name} is not set (in .env, an --env-file or the environment) and "
                                     "has no default")
        value, source = found
        secret = source == "the environment" and looks_secret(name)
        self.record(name, source, where, secret)
        return secret_marker(name) if secret else value

    def record(self, name: str, source: str, where: str, secret: bool = False) -> None:
        use = self.uses.setdefault(name, Use(name, source, secret))
        if where not in use.where:
            use.where.append(where)


def closing_brace(text: str, start: int) -> int:
    """The index of the ``}`` closing a ``${`` whose contents start at ``start`` (nested ``${...}`` skipped), or -1."""
    depth = 1
    index = start
    while index < len(text):
        if text.startswith("${", index):
            depth += 1
            index += 2
            continue
        if text[index] == "}":
            depth -= 1
            if depth == 0:
                return index
        index += 1
    return -1


# ---------------------------------------------------------------- .env files

ESCAPES = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "\\": "\\", "$": "\\$"}
LINE = re.compile(r"\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_.-]*)\s*=\s*(.*)$", re.DOTALL)


def parse_env_text(text: str, lookup: Variables | None = None, label: str = ".env") -> dict[str, str]:
    """A dotenv file as Compose reads it: ``NAME=value`` lines (``export`` allowed), ``#`` comments, single
    quotes literal, double quotes with ``\\n`` escapes, values (unquoted or double-quoted) interpolated with the
    names defined above them and ``lookup``.

    :raises InterpolationError: a line that is not ``NAME=value``, an unclosed quote, or bad interpolation.
    """
    values: dict[str, str] = {}
    lines = text.splitlines()
    number = 0
    while number < len(lines):
        line = lines[number]
        number += 1
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        match = LINE.match(line)
        if not match:
            raise InterpolationError(f"{label} line {number}: not NAME=value: {line.strip()[:80]!r}")
        name, raw = match.group(1), match.group(2)
        quote = raw[:1] if raw[:1] in ("'", '"') else ""
        if quote:
            body = raw[1:]
            while closing_quote(body, quote) < 0 and number < len(lines):
                body += "\n" + lines[number]
                number += 1
            end = closing_quote(body, quote)
            if end < 0:
                raise InterpolationError(f"{label}: {name}: the {quote} quote is not closed")
            value = body[:end]
            if quote == '"':
                value = re.sub(r"\\(.)", lambda m: ESCAPES.get(m.group(1), "\\" + m.group(1)), value)
        else:
            value = re.split(r"\s+#", raw, maxsplit=1)[0].strip()
        if quote != "'":
            scope = Variables(lookup.environ if lookup else {}, [*(lookup.files if lookup else []), (label, values)])
            interpolator = Interpolator(scope)
            value = interpolator.text(value.replace("\\$", "$$"), f"{label}: {name}")
            environ = scope.environ  # inside a .env file a secret from the environment is just its value
            value = _MARKER.sub(lambda m, environ=environ: environ.get(m.group(1), ""), value)
        values[name] = value
    return values


def closing_quote(body: str, quote: str) -> int:
    index = 0
    while index < len(body):
        if body[index] == "\\" and quote == '"':
            index += 2
            continue
        if body[index] == quote:
            return index
        index += 1
    return -1


def read_env_file(path: Path, lookup: Variables | None = None, label: str | None = None) -> dict[str, str]:
    """:func:`parse_env_text` of the file at ``path``.

    :raises OSError: when it cannot be read. :raises InterpolationError: as :func:`parse_env_text`.
    """
    return parse_env_text(path.read_text(encoding="utf-8"), lookup, label or str(path))
