"""Ranges of config fields, stated once: in the field's metadata, where the field is defined.

Every config type (the library's ``TableConfig``, ``MixCacheConfig``, ``MetaConfig``,
``SplitConfig`` and the pipeline's own sections in ``gmeta_tf.config``) declares a field's
range beside its default::

    capacity: int = config_fields.field(min=1, max=2**31 - 1)

The type checks its fields in ``__post_init__`` with :func:`check`, which raises
:class:`FieldError` naming the type, the field, the value and what is allowed. The YAML
loader (``gmeta_tf.config``) checks the same metadata before it builds the type, and turns
a ``FieldError`` the type raises into an error naming the config key. :func:`load_yaml`
reads every YAML the configs come from (pipelines, ``--set`` values, ``tuned.yaml``,
mapping files).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import re
import types
import typing
from typing import Any, Literal, Mapping

import yaml


class _Loader(yaml.SafeLoader):
    """YAML as PyYAML reads it, but numbers in exponent form without a dot (``1e-4``)
    are floats, as in YAML 1.2 (PyYAML's YAML 1.1 reads them as strings)."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"""^(?:[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+
                   |[-+]?\.[0-9_]+[eE][-+]?[0-9]+)$""", re.X),
    list("-+0123456789."))


def _mapping_once_per_key(loader: _Loader, node: yaml.MappingNode) -> dict:
    """A YAML mapping whose keys are each given once: a key given twice (the later value
    silently winning, as PyYAML reads it) is an error naming both lines."""
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=True)
        try:
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} given twice (first on line {seen[key] + 1})",
                    key_node.start_mark)
        except TypeError:  # an unhashable key: PyYAML's own error follows
            continue
        seen[key] = key_node.start_mark.line
    return loader.construct_mapping(node, deep=True)


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_once_per_key)


def load_yaml(text):
    """Config YAML (a file's text or a stream, or a ``--set`` value) as Python values."""
    return yaml.load(text, Loader=_Loader)


class ConfigError(ValueError):
    """A config file, key or value is not allowed."""


class FieldError(ValueError):
    """A config field's value is not allowed.

    Attributes:
        owner: The config type (and instance name), e.g. ``"TableConfig 'item'"``.
        name: The field, e.g. ``"dim"``.
        value: The value given.
        expected: What is allowed, in words.
    """

    def __init__(self, owner: str, name: str, value: Any, expected: str) -> None:
        self.owner, self.name, self.value, self.expected = owner, name, value, expected
        super().__init__(f"{owner}: {name} = {value!r} is not allowed: expected {expected}")


def field(default: Any = dataclasses.MISSING, *, min: float | None = None,  # noqa: A002
          max: float | None = None, min_exclusive: float | None = None,  # noqa: A002
          **kwargs) -> Any:
    """A dataclass field with its allowed range (inclusive ``min``/``max``, exclusive
    ``min_exclusive``); a tuple value has the range checked per item."""
    metadata = {key: value for key, value in (("min", min), ("max", max),
                                              ("min_exclusive", min_exclusive))
                if value is not None}
    return dataclasses.field(default=default, metadata=metadata, **kwargs)


def range_violation(metadata: Mapping[str, Any], value: Any) -> str | None:
    """What the range in ``metadata`` allows, when ``value`` (or an item of a tuple value)
    is outside it; None when it is inside (or None, or there is no range)."""
    if value is None or not metadata:
        return None
    for item in value if isinstance(value, tuple) else (value,):
        if isinstance(item, str):  # a named choice beside a number: no range
            continue
        kind = "an integer" if isinstance(item, numbers.Integral) else "a number"
        if ("min" in metadata and "max" in metadata and metadata["max"] <= 1e6
                and not metadata["min"] <= item <= metadata["max"]):
            # the whole range, unless its top is only a storage limit (int32's)
            return f"{kind} in [{metadata['min']}, {metadata['max']}]"
        if "min" in metadata and item < metadata["min"]:
            return f"{kind} >= {metadata['min']}"
        if "max" in metadata and item > metadata["max"]:
            return f"{kind} <= {metadata['max']}"
        if "min_exclusive" in metadata and item <= metadata["min_exclusive"]:
            return f"a number > {metadata['min_exclusive']}"
    return None


def type_violation(hint: Any, value: Any) -> str | None:
    """What a type hint allows, when ``value`` is not of it; None when it is. Checks what
    config fields use (bool, int, float, str, Literal, Optional, tuples of them); other
    hints (nested types, ``Any``) are the owner's to check."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1:
            return type_violation(inner[0], value)
        found = [type_violation(a, value) for a in inner]
        return None if None in found else " or ".join(found)
    if origin is Literal:
        return None if value in args else f"one of {list(args)}"
    if origin is tuple:
        if isinstance(value, str) or not isinstance(value, (list, tuple)):
            return f"a list of {type_name(args[0])}"
        for item in value:
            if type_violation(args[0], item):
                return f"a list of {type_name(args[0])}"
        return None
    if hint is bool:
        return None if isinstance(value, bool) else "true or false"
    if hint is int:
        ok = isinstance(value, numbers.Integral) and not isinstance(value, bool)
        return None if ok else "an integer"
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            return "a number"
        return None if math.isfinite(value) else "a finite number (not NaN or infinity)"
    if hint is str:
        return None if isinstance(value, str) and value else "a non-empty string"
    return None


def type_name(hint: Any) -> str:
    if typing.get_origin(hint) is Literal:
        return f"one of {list(typing.get_args(hint))}"
    return {int: "integers", float: "numbers", str: "strings", bool: "booleans"}.get(
        hint, getattr(hint, "__name__", str(hint)))


def check(obj: Any, owner: str | None = None) -> None:
    """Checks every field of a config dataclass instance against its type and range.

    Raises:
        FieldError: naming ``owner`` (default: the type's name), the field and the value.
    """
    owner = owner or type(obj).__name__
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        expected = type_violation(hints[f.name], value)
        if expected is None:
            expected = range_violation(f.metadata, value)
        if expected is not None:
            raise FieldError(owner, f.name, value, expected)
