"""The YAML parser's errors in plain words, at the line and column they are about.

ruamel.yaml says what its grammar expected (`while parsing a block collection, expected
<block end>, but found '<block mapping start>'`); a user wants to hear that a line is
indented wrongly. Each common problem has a sentence here; one without is given in a
plain sentence too, with the parser's own words in parentheses, so nothing is lost.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ruamel.yaml.constructor import ConstructorError, RoundTripConstructor
from ruamel.yaml.error import MarkedYAMLError

# The parser's names of the tokens it found, as a user would name them.
_TOKENS = {
    "<block mapping start>": "a key",
    "?": "a key",
    "<block sequence start>": "a list",
    "-": "a list item ('- ')",
    "<scalar>": "a value",
    "<stream end>": "the end of the file",
    "<block end>": "the end of a block",
    "<document start>": "'---'",
    "<document end>": "'...'",
    "<alias>": "an alias (*name)",
    "<anchor>": "an anchor (&name)",
    "<tag>": "a tag (!name)",
}
_KEYS = ("<block mapping start>", "?")
_ITEMS = ("-", "<block sequence start>")
_CLOSING = {"}": "{", "]": "["}


@dataclass(frozen=True)
class Said:
    """What the parser said: the problem and where, what it was reading and from where."""

    problem: str
    context: str
    at: Any  # ruamel's Mark: 0-based line and column
    start: Any

    @property
    def started(self) -> str:
        """Where what the parser was reading began, as LINE:COLUMN."""
        mark = self.start or self.at
        return f"{mark.line + 1}:{mark.column + 1}" if mark else "the start"

    @property
    def column(self) -> int:
        return (self.start.column if self.start else 0) + 1


Reader = Callable[[re.Match[str], Said], tuple[Any, str]]


_TAGGED = "while constructing a tagged value"


class Constructor(RoundTripConstructor):
    """ruamel's round-trip constructor, but a tagged value that is not of its tag
    (`!!bool maybe`, `!!int five`) is a ConstructorError at that value: ruamel lets the
    conversion's KeyError or ValueError out, with no position, and `recoveryd check` or
    a reload ended in a traceback."""

    def construct_non_recursive_object(self, node: Any, tag: str | None = None) -> Any:
        try:
            return super().construct_non_recursive_object(node, tag)
        except (ValueError, KeyError, TypeError):
            name = str(node.tag).replace("tag:yaml.org,2002:", "!!")
            raise ConstructorError(
                _TAGGED, None, f"{node.value!r} is not a {name}", node.start_mark
            ) from None


def explain(error: MarkedYAMLError) -> tuple[Any, str]:
    """The mark a user should look at, and the sentence that says what is wrong there."""
    said = Said(
        error.problem or "",
        error.context or "",
        error.problem_mark or error.context_mark,
        error.context_mark,
    )
    for context, problem, read in _READERS:
        found = re.fullmatch(problem, said.problem)
        if found and re.fullmatch(context, said.context):
            return read(found, said)
    words = ", ".join(part for part in (said.context, said.problem) if part)
    return said.at, f"the parser stops here ({words})"


def _token(name: str) -> str:
    return _TOKENS.get(name, repr(name))


def _block_end(found: re.Match[str], said: Said) -> tuple[Any, str]:
    """A block mapping or list ended where its next line did not fit it: nearly always
    an indentation slip."""
    token = found["token"]
    mapping = "mapping" in said.context
    block = f"the {'mapping' if mapping else 'list'} that begins at {said.started}"
    if mapping and token in _KEYS:
        sentence = (
            f"this line is indented to no level above it: the keys of {block} are at "
            f"column {said.column}"
        )
    elif token in _KEYS:
        sentence = (
            f"a key where {block} expects an item: items begin with '- ' (a space after "
            f"the dash) at column {said.column}, and an item's keys line up with its first"
        )
    elif mapping and token in _ITEMS:
        sentence = (
            f"a list item where {block} expects a key: line it up with the other items of "
            "its list, or begin the list under a key"
        )
    elif token in _CLOSING:
        sentence = f"a '{token}' with no '{_CLOSING[token]}' open before it"
    elif token == "<scalar>":
        expects = "a key" if mapping else "an item"
        sentence = (
            f"a value where {block} expects {expects}: text after a closing quote, or a "
            "line indented wrongly"
        )
    else:
        sentence = f"{_token(token)} where {block} expects {'a key' if mapping else 'an item'}"
    return said.at, sentence


def _flow(found: re.Match[str], said: Said) -> tuple[Any, str]:
    """Inside `{...}` or `[...]`, something other than a comma or the closing bracket."""
    close = found["close"]
    kind = "mapping" if close == "}" else "list"
    quoted = "': ' or ', '" if close == "}" else "', '"
    return said.at, (
        f"a ',' or the '{close}' closing the {kind} opened at {said.started} belongs here, "
        f"not {_token(found['token'])}: a comma or the '{close}' is missing, or a value "
        f"holding {quoted} needs quotes"
    )


def _words(sentence: str, *, at_start: bool = False) -> Reader:
    """A reader that says `sentence`, formatted with the match's groups and `started`."""

    def read(found: re.Match[str], said: Said) -> tuple[Any, str]:
        mark = said.start if at_start and said.start else said.at
        return mark, sentence.format(**found.groupdict(), started=said.started)

    return read


_ANY = r".*"
# (the parser's context, its problem, the reader that words it), first match wins.
_READERS: tuple[tuple[str, str, Reader], ...] = (
    (
        _ANY,
        r"found character '\\t' that cannot start any token",
        _words("a tab character: YAML indents with spaces only"),
    ),
    (
        _ANY,
        r"found character (?P<char>'.+') that cannot start any token",
        _words("{char} cannot begin a value: put the value in quotes"),
    ),
    (
        _ANY,
        r"mapping values are not allowed here",
        _words(
            "a ':' where no key can begin: put a value that holds ': ' in quotes, or indent "
            "this line like the keys beside it"
        ),
    ),
    (
        _ANY,
        r"sequence entries are not allowed here",
        _words("a list item ('- ') cannot begin here: begin the list on the line under its key"),
    ),
    (
        r"while scanning a simple key",
        r"could not find expected ':'",
        _words(
            "a line that is neither 'key: value' nor '- item': the ':' after the key is "
            "missing, or the space after the ':'",
            at_start=True,
        ),
    ),
    (
        r"while scanning a quoted scalar",
        r"found unexpected end of stream",
        _words("the quote that opens here is never closed", at_start=True),
    ),
    (
        r"while scanning a quoted scalar",
        r"found unexpected document separator",
        _words("the quote that opens here is not closed before a '---' line", at_start=True),
    ),
    (
        r"while scanning a double-quoted scalar",
        r"found unknown escape character '(?P<char>.+)'",
        _words(
            "'\\{char}' is no escape in double quotes: write the value in single quotes, "
            "where a backslash is itself, or double the backslash"
        ),
    ),
    (
        r"while parsing a block (mapping|collection)",
        r"expected <block end>, but found '(?P<token>.+)'",
        _block_end,
    ),
    (
        r"while parsing a flow (mapping|sequence)",
        r"expected ',' or '(?P<close>[]}])', but got '(?P<token>.+)'",
        _flow,
    ),
    (
        _ANY,
        r"expected the node content, but found '(?P<token>.+)'",
        lambda found, said: (said.at, f"a value is missing here, before {_token(found['token'])}"),
    ),
    (
        r"while constructing a mapping",
        r'found duplicate key "(?P<key>.*)" with value .*',
        _words("'{key}' is given twice in the mapping that begins at {started}"),
    ),
    (
        r"expected a single document in the stream",
        r"but found another document",
        _words("a second document begins here: a rules file is one document"),
    ),
    (
        _TAGGED,
        r"(?P<value>.+) is not a (?P<tag>.+)",
        _words(
            "{value} is tagged {tag} but is not one: leave the tag out, or give a value of its kind"
        ),
    ),
    (
        r"",
        r"found undefined alias '(?P<name>.+)'",
        _words("*{name} names no anchor: an alias needs its &{name} above it"),
    ),
)
