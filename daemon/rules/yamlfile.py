"""YAML files read with their positions, and errors that point back into them.

Every mistake in a rules or rule-test file is reported as `PATH:LINE:COL: yaml.path:
message`, all of them at once (docs/rules.md#every-mistake-at-once). Validation works on
plain Python values; the parsed document is kept beside them only to turn a path into a
line and a column.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

from pydantic import BaseModel, ValidationError
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import MarkedYAMLError, YAMLError
from ruamel.yaml.events import AliasEvent, CollectionEndEvent, CollectionStartEvent

from daemon.foundation.words import unknown_key, with_guess
from daemon.rules.yamlsyntax import Constructor, explain

Loc = tuple[str | int, ...]
M = TypeVar("M", bound=BaseModel)


class Mistake(NamedTuple):
    """A problem found in the plain values, before it is given a line and a column."""

    loc: Loc
    message: str
    at_key: bool = False  # about the key itself (unknown, not allowed here), not its value


@dataclass(frozen=True, order=True)
class Problem:
    """One mistake, at a 1-based line and column."""

    file: str
    line: int
    column: int
    path: str  # `rules[2].overrides.delay`; `<document>` for the file as a whole
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}: {self.path}: {self.message}"


class FileError(Exception):
    """A file that cannot be used, with every problem found in it."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        super().__init__("\n".join(map(str, problems)))
        self.problems = tuple(problems)


class Unreadable(Exception):
    """The file could not be read at all (missing, a directory, not UTF-8)."""


@dataclass(frozen=True)
class Document:
    """A parsed YAML file: `data` as plain values, and where each of them stands."""

    file: str
    text: str
    data: Any
    _tree: Any

    def problem(self, loc: Loc, message: str, *, at_key: bool = False) -> Problem:
        """A Problem at `loc`; `at_key` points at a mapping key rather than its value."""
        line, column = _position(self._tree, loc, at_key)
        return Problem(self.file, line + 1, column + 1, yaml_path(loc), message)

    def problems(self, found: Iterable[Mistake]) -> list[Problem]:
        return [self.problem(loc, message, at_key=at_key) for loc, message, at_key in found]

    def validate(self, model: type[M]) -> tuple[M | None, list[Problem]]:
        """The document as `model`, strictly (no coercion, camelCase keys only), or None
        and every problem pydantic found, in words a user understands."""
        text = json.dumps(self.data, default=str)
        try:
            return model.model_validate_json(text, strict=True, by_alias=True, by_name=False), []
        except ValidationError as exc:
            return None, self._problems(exc, model)

    def _problems(self, error: ValidationError, model: type[BaseModel]) -> list[Problem]:
        problems = []
        for item in error.errors(include_url=False):
            loc = _document_loc(self._tree, item["loc"])
            kind = item["type"]
            if kind == "extra_forbidden":
                keys = keys_at(model, loc[:-1])
                problems.append(self.problem(loc, unknown_key(loc[-1], keys), at_key=True))
            else:
                problems.append(self.problem(loc, _message(kind, item)))
        return problems


def read_document(path: Path, name: str | None = None) -> Document:
    """Parse the YAML file at `path`; FileError for bad YAML, Unreadable for no file."""
    try:
        with path.open("rb") as stream:
            data = stream.read(MAX_FILE_BYTES + 1)  # never more: the file may be huge
        _check_size(data, name or str(path))
        text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise Unreadable(f"{path}: cannot read: {reason}") from None
    return parse_document(text, name or str(path))


def parse_document(text: str, file: str) -> Document:
    """Parse `text`, refusing what would cost more to load than a rules file needs: over
    MAX_FILE_BYTES, nested deeper than MAX_DEPTH (the parser's time grows with the square
    of the depth), more than MAX_ALIASES aliases or anchors, or aliases that expand it
    past MAX_VALUES values (the "billion laughs")."""
    _check_size(text.encode("utf-8"), file)
    yaml = YAML(typ="rt", pure=True)
    yaml.Constructor = Constructor
    try:
        first_alias = _check_events(yaml.parse(text), file)
        tree = yaml.load(text)
    except MarkedYAMLError as exc:
        raise FileError([_syntax_problem(file, exc)]) from None
    except YAMLError as exc:  # several documents, and other errors without a position
        raise FileError([Problem(file, 1, 1, "<document>", f"not valid YAML: {exc}")]) from None
    if first_alias is not None:
        _check_expansion(tree, file, first_alias)
    return Document(file, text, plain(tree), tree)


# What a rules file may hold. Hundreds of rules take a few hundred KiB and a few thousand
# values; anchors and aliases are for sharing a block or two.
MAX_FILE_BYTES = 1024 * 1024
MAX_DEPTH = 50
MAX_ALIASES = 100
MAX_VALUES = 100_000


def _check_size(data: bytes, file: str) -> None:
    if len(data) <= MAX_FILE_BYTES:
        return
    kept = data[:MAX_FILE_BYTES].decode("utf-8", errors="ignore")
    line = kept.count("\n") + 1
    column = len(kept) - (kept.rfind("\n") + 1) + 1
    message = f"the file is over {MAX_FILE_BYTES} bytes, the most a rules file may be"
    raise FileError([Problem(file, line, column, "<document>", message)])


def _check_events(events: Iterable[Any], file: str) -> Any:
    """The first alias's position (None if there is none); FileError at the event that
    nests past MAX_DEPTH or is an alias or anchor past MAX_ALIASES. Events only, read
    as they are parsed: nothing is built, and the first one too many stops the parse."""
    aliases = anchors = depth = 0
    first = None
    for event in events:
        if isinstance(event, AliasEvent):
            aliases += 1
            first = first or event.start_mark
        elif getattr(event, "anchor", None):
            anchors += 1
        depth += isinstance(event, CollectionStartEvent) - isinstance(event, CollectionEndEvent)
        message = None
        if depth > MAX_DEPTH:
            message = f"nested deeper than {MAX_DEPTH} levels"
        elif aliases > MAX_ALIASES or anchors > MAX_ALIASES:
            kind = "aliases" if aliases > MAX_ALIASES else "anchors"
            message = f"more than {MAX_ALIASES} {kind}; a rules file needs a few at most"
        if message is not None:
            mark = event.start_mark
            raise FileError([Problem(file, mark.line + 1, mark.column + 1, "<document>", message)])
    return first


def _check_expansion(tree: Any, file: str, first_alias: Any) -> None:
    """FileError, at the first alias, when the aliases expand the document past
    MAX_VALUES values; counted without expanding anything (a shared value once)."""
    sizes: dict[int, int] = {}

    def size(node: Any) -> int:
        if not isinstance(node, dict | list):
            return 1
        if id(node) not in sizes:
            children = [*node.keys(), *node.values()] if isinstance(node, dict) else node
            sizes[id(node)] = 1 + sum(size(child) for child in children)
        return sizes[id(node)]

    if size(tree) > MAX_VALUES:
        message = f"the aliases expand the file past {MAX_VALUES} values"
        line, column = first_alias.line + 1, first_alias.column + 1
        raise FileError([Problem(file, line, column, "<document>", message)])


def _syntax_problem(file: str, error: MarkedYAMLError) -> Problem:
    """Where the parser gave up, or where what it gave up on began, in plain words."""
    mark, sentence = explain(error)
    line, column = (mark.line, mark.column) if mark else (0, 0)
    return Problem(file, line + 1, column + 1, "<document>", f"not valid YAML: {sentence}")


def plain(node: Any) -> Any:
    """ruamel's round-trip values as the builtin types they stand for."""
    if isinstance(node, dict):
        return {plain(key): plain(value) for key, value in node.items()}
    if isinstance(node, list):
        return [plain(item) for item in node]
    if isinstance(node, bool) or node is None:
        return node
    for builtin in (int, float, str):
        if isinstance(node, builtin):
            return builtin(node)
    return node  # dates and the like: validation says what was expected instead


def keys_at(model: type[BaseModel], loc: Loc) -> list[str]:
    """The keys the mapping at `loc` takes, for "did you mean" hints: those of the model
    found by following `loc` down from `model`."""
    current: type[BaseModel] | None = model
    for part in loc:
        if current is None:
            return []
        if isinstance(part, str):
            fields = current.model_fields.items()
            annotation = next((f.annotation for n, f in fields if (f.alias or n) == part), None)
            current = next(_models_in(annotation), None)
    return [f.alias or n for n, f in current.model_fields.items()] if current else []


def _models_in(annotation: Any) -> Iterator[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
    for arg in getattr(annotation, "__args__", ()):
        yield from _models_in(arg)


def yaml_path(loc: Loc) -> str:
    """`("rules", 2, "match", "url")` as `rules[2].match.url`."""
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "<document>"


def shown(value: Any) -> str:
    """A value as the user wrote it, for an error message."""
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "a mapping" if value else "an empty mapping"
    if isinstance(value, list):
        return "a list" if value else "an empty list"
    return repr(value)


def _position(tree: Any, loc: Loc, at_key: bool) -> tuple[int, int]:
    """The line and column (0-based) of the deepest node of `loc` that exists."""
    node, line, column = tree, 0, 0
    if isinstance(tree, CommentedMap | CommentedSeq):
        line, column = tree.lc.line, tree.lc.col
    for index, part in enumerate(loc):
        last = index == len(loc) - 1
        if isinstance(node, CommentedMap) and part in node:
            # A null has no token of its own: ruamel gives the next one, maybe lines below.
            on_key = (last and at_key) or node[part] is None
            line, column = node.lc.key(part) if on_key else node.lc.value(part)
        elif isinstance(node, CommentedSeq) and isinstance(part, int) and part < len(node):
            line, column = node.lc.item(part)
        else:
            break
        node = node[part]
    return line, column


def _document_loc(tree: Any, loc: Sequence[str | int]) -> Loc:
    """pydantic's location, less the parts that name no YAML node (union members and
    validator names below a scalar)."""
    kept: list[str | int] = []
    node = tree
    for part in loc:
        if isinstance(node, CommentedMap):
            kept.append(part)
            node = node.get(part)  # None for a missing or unknown key: nothing deeper exists
        elif isinstance(node, CommentedSeq) and isinstance(part, int) and part < len(node):
            kept.append(part)
            node = node[part]
    return tuple(kept)


_WORDS = {
    "missing": "is required",
    "int_type": "must be a whole number",
    "int_parsing": "must be a whole number",
    "int_from_float": "must be a whole number",
    "float_type": "must be a number",
    "float_parsing": "must be a number",
    "bool_type": "must be true or false",
    "bool_parsing": "must be true or false",
    "string_type": "must be a string",
    "list_type": "must be a list",
    "tuple_type": "must be a list",
    "dict_type": "must be a mapping",
    "model_type": "must be a mapping",
    "model_attributes_type": "must be a mapping",
    "too_short": "must not be empty",
}


# The values in pydantic's `'resume', 'restart' or 'ignore'`.
_QUOTED = re.compile(r"'((?:[^'\\]|\\.)*)'")


def _message(kind: str, item: Any) -> str:
    context = item.get("ctx") or {}
    value = item.get("input")
    if kind == "value_error":
        return str(context.get("error", item["msg"]))
    if kind == "missing":
        return "is required"
    if kind == "literal_error":
        expected = context["expected"]
        words = f"one of {expected}" if " or " in expected else expected
        return with_guess(f"must be {words}; got {shown(value)}", value, _QUOTED.findall(expected))
    for bound, words in (("ge", "at least"), ("gt", "more than"), ("le", "at most")):
        if bound in context:
            return f"must be {words} {context[bound]}; got {shown(value)}"
    if kind in _WORDS:
        return f"{_WORDS[kind]}; got {shown(value)}"
    return f"{item['msg']}; got {shown(value)}"
