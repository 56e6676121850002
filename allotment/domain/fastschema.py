"""A quick yes for documents that a JSON schema accepts.

python-jsonschema takes about 0.2 ms to accept a claim's ``PUT
/allocations`` body, a good share of the request.  :func:`compile` turns
a schema into a plain function that answers True only for documents every
keyword accepts, checking each keyword at least as strictly as jsonschema's
Draft 4 does; a False (or a schema with a keyword it does not know: then no
function at all) sends the document to jsonschema, which finds the error and
words it.  So no answer depends on this module, only how fast a valid
document is accepted.
"""

from __future__ import annotations

import re
from typing import Any, Callable

Check = Callable[[Any], bool]

#: Keywords that never reject anything.
_ANNOTATIONS = frozenset({"description", "title", "default", "examples"})

#: The Python types (exactly: ``type(x) in ...``) of each JSON type.
_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    # Stricter than jsonschema (no 1.0, no int subclasses): a False only costs time.
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "null": (type(None),),
}


class Unsupported(Exception):
    """The schema uses a keyword (or a form of one) not handled here."""


def compile(schema: Any, format_checker: Any) -> Check | None:  # noqa: A001 - the verb
    """A check for ``schema`` (whose ``format`` names ``format_checker``
    knows), or None when it uses anything this module does not handle."""
    if not isinstance(schema, dict) or "$schema" in schema:
        return None
    try:
        return _compile(schema, format_checker)
    except Unsupported:
        return None


def _compile(schema: Any, fc: Any) -> Check:
    if schema is True or schema == {}:
        return lambda x: True
    if not isinstance(schema, dict):
        raise Unsupported(schema)
    checks: list[Check] = []
    properties = schema.get("properties", {})
    patterns = schema.get("patternProperties", {})
    for key, value in schema.items():
        if key in _ANNOTATIONS:
            continue
        maker = _KEYWORDS.get(key)
        if maker is None:
            raise Unsupported(key)
        checks.append(maker(value, fc, properties, patterns))
    if len(checks) == 1:
        return checks[0]

    def check(x: Any) -> bool:
        for one in checks:
            if not one(x):
                return False
        return True

    return check


def _type(value, fc, properties, patterns) -> Check:
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not all(isinstance(n, str) and n in _TYPES for n in names):
        raise Unsupported(value)
    types = frozenset(kind for n in names for kind in _TYPES[n])
    return lambda x: type(x) in types


def _properties(value, fc, properties, patterns) -> Check:
    subs = {name: _compile(sub, fc) for name, sub in value.items()}

    def check(x: Any) -> bool:
        if type(x) is not dict:
            return True
        for name, sub in subs.items():
            if name in x and not sub(x[name]):
                return False
        return True

    return check


#: Keys remembered per set of patterns (emptied when full: keys such as
#: provider uuids are not few).
MAX_KEYS = 1024


def _matching(patterns: list[str]) -> Callable[[str], tuple[int, ...]]:
    """key -> the indexes of the ``patterns`` it matches, remembered: the
    same few keys come back on every request, and a dict lookup costs a
    fraction of a regular expression search."""
    searches = [re.compile(pattern).search for pattern in patterns]
    known: dict[str, tuple[int, ...]] = {}

    def matching(key: str) -> tuple[int, ...]:
        found = known.get(key)
        if found is None:
            if len(known) >= MAX_KEYS:
                known.clear()
            found = known[key] = tuple(i for i, search in enumerate(searches) if search(key))
        return found

    return matching


def _pattern_properties(value, fc, properties, patterns) -> Check:
    matching = _matching(list(value))
    subs = [_compile(sub, fc) for sub in value.values()]

    def check(x: Any) -> bool:
        if type(x) is not dict:
            return True
        for key, item in x.items():
            for index in matching(key):
                if not subs[index](item):
                    return False
        return True

    return check


def _additional_properties(value, fc, properties, patterns) -> Check:
    matching = _matching(list(patterns))
    if value is True:
        return lambda x: True
    sub = None if value is False else _compile(value, fc)

    def check(x: Any) -> bool:
        if type(x) is not dict:
            return True
        for key, item in x.items():
            if key in properties or matching(key):
                continue
            if sub is None or not sub(item):
                return False
        return True

    return check


def _required(value, fc, properties, patterns) -> Check:
    names = list(value)
    return lambda x: type(x) is not dict or all(name in x for name in names)


def _bound(kind: type, measure: Callable[[Any], Any], at_least: bool):
    def maker(value, fc, properties, patterns) -> Check:
        if type(value) not in (int, float):
            raise Unsupported(value)
        if kind is float:  # numbers: int or float, never bool
            applies = lambda x: type(x) is int or type(x) is float  # noqa: E731
        else:
            applies = lambda x: type(x) is kind  # noqa: E731
        if at_least:
            return lambda x: not applies(x) or measure(x) >= value
        return lambda x: not applies(x) or measure(x) <= value
    return maker


def _pattern(value, fc, properties, patterns) -> Check:
    search = re.compile(value).search
    return lambda x: type(x) is not str or search(x) is not None


def _items(value, fc, properties, patterns) -> Check:
    if not isinstance(value, dict):
        raise Unsupported(value)  # the tuple form
    sub = _compile(value, fc)
    return lambda x: type(x) is not list or all(sub(item) for item in x)


def _enum(value, fc, properties, patterns) -> Check:
    if not isinstance(value, list) or not all(type(v) in (str, int) for v in value):
        raise Unsupported(value)
    # Of the same type too: jsonschema tells True from 1 and 1.0 from 1.
    allowed = frozenset((type(v), v) for v in value)
    return lambda x: (type(x), x) in allowed if type(x) in (str, int) else False


def _format(value, fc, properties, patterns) -> Check:
    if fc is None:
        return lambda x: True
    return lambda x: fc.conforms(x, value)


_KEYWORDS: dict[str, Callable[..., Check]] = {
    "type": _type,
    "properties": _properties,
    "patternProperties": _pattern_properties,
    "additionalProperties": _additional_properties,
    "required": _required,
    "minProperties": _bound(dict, len, True),
    "maxProperties": _bound(dict, len, False),
    "minItems": _bound(list, len, True),
    "maxItems": _bound(list, len, False),
    "minLength": _bound(str, len, True),
    "maxLength": _bound(str, len, False),
    "minimum": _bound(float, lambda x: x, True),
    "maximum": _bound(float, lambda x: x, False),
    "pattern": _pattern,
    "items": _items,
    "enum": _enum,
    "format": _format,
}
