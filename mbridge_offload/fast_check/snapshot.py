"""A config tree as plain data, and back as look-alike dataclasses that need no Megatron import.

``dump(cfg)`` turns a built ConfigContainer into plain Python data: every dataclass with its class name,
its fields' annotations (as a small type language) and defaults, and every value. ``load(data)`` makes a
tree of dataclasses of the same names, fields, annotations and values, created on the fly: the override
machinery (overrides/), the rules, the planner and describe() read it exactly as they read the real one,
since they only use dataclass fields, annotations and attribute values.

A look-alike class derives from stand-ins of the real class's bases: empty classes of the same names, each
noting the methods its original defines (``DEFINES``), so a check by class name (``type(x).__mro__``) or by
which class defines a method reads the look-alike as the real config; the methods themselves are not rebuilt.

What cannot be represented faithfully (functions, objects of other classes, torch dtypes) is kept as an
``Opaque`` value that shows as the original did; an override that would set a field of such a type, or walk
through a null section (which would create a real section), is not answered from a snapshot
(``answerable`` says so), and the command takes the slow path.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import re
import types
import typing
from pathlib import Path, PosixPath
from typing import Any, Literal, Union

FORMAT = 5  # bump when the data layout changes (part of the cache key)
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
# the attribute of a look-alike class or base stand-in naming the methods its original defines in its own body
DEFINES = "__snapshot_defines__"


class Opaque:
    """A value the snapshot cannot rebuild: shown (str, repr) as the original was, equal to its twin."""

    __slots__ = ("type_name", "text")

    def __init__(self, type_name: str, text: str):
        self.type_name, self.text = type_name, text

    def __repr__(self) -> str:
        return self.text

    __str__ = __repr__

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, Opaque) and (other.type_name, other.text) == (self.type_name, self.text)

    def __hash__(self) -> int:
        return hash((self.type_name, self.text))

    def __deepcopy__(self, memo: dict) -> "Opaque":
        return self


class OpaqueType:
    """The annotation of a field whose type a snapshot cannot rebuild: overrides of it take the slow path."""


class _DType:
    """torch.dtype's look-alike: the same text and bytes per element (what rules and the planner read)."""

    __slots__ = ("text", "itemsize")

    def __init__(self, text: str, itemsize: int):
        self.text, self.itemsize = text, itemsize

    def __repr__(self) -> str:
        return self.text

    __str__ = __repr__

    def __eq__(self, other: Any) -> bool:
        return str(other) == self.text

    def __hash__(self) -> int:
        return hash(self.text)

    def __deepcopy__(self, memo: dict) -> "_DType":
        return self


_DType.__module__ = "torch"  # describe.show() and the planner treat it as the dtype it stands for
_DType.__qualname__ = _DType.__name__ = "dtype"


def _is_dtype(obj: Any) -> bool:
    return type(obj).__module__ == "torch" and type(obj).__name__ == "dtype"


def _is_dtype_class(annotation: Any) -> bool:
    return getattr(annotation, "__module__", "") == "torch" and getattr(annotation, "__name__", "") == "dtype"


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _defined_methods(cls: type) -> list[str]:
    """The public methods ``cls`` defines in its own body (not inherited)."""
    return sorted(name for name, attr in vars(cls).items() if not name.startswith("_")
                  and isinstance(attr, (types.FunctionType, staticmethod, classmethod)))


def _bases(cls: type) -> list[tuple[str, str, str, list[str]]]:
    """(module, qualname, name, methods it defines) of each class ``cls`` derives from, in method resolution order
    (without ``cls`` and ``object``)."""
    return [(k.__module__, k.__qualname__, k.__name__, _defined_methods(k)) for k in cls.__mro__[1:-1]]


def _text(value: Any) -> str:
    return _ADDRESS.sub("", repr(value))


class _Dumper:
    def __init__(self):
        self.classes: dict[str, dict] = {}
        self.enums: dict[str, list] = {}

    def annotation(self, annotation: Any) -> tuple:
        origin, args = typing.get_origin(annotation), typing.get_args(annotation)
        if annotation is Any or annotation is object:
            return ("any",)
        if annotation is type(None) or annotation is None:
            return ("none",)
        if annotation in (int, float, bool, str):
            return ("prim", annotation.__name__)
        if annotation in (Path, PosixPath):
            return ("path",)
        if origin is Literal:
            if all(isinstance(a, (int, float, bool, str, type(None))) for a in args):
                return ("literal", tuple(args))
            return ("opaque",)
        if origin in (Union, types.UnionType):
            return ("union", tuple(self.annotation(a) for a in args))
        if origin in (list, tuple, set, frozenset) or annotation in (list, tuple, set, frozenset):
            kind = (origin or annotation).__name__
            return ("seq", kind, tuple(self.annotation(a) for a in args if a is not Ellipsis), Ellipsis in args)
        if origin is typing.Sequence or origin is __import__("collections.abc").abc.Sequence:
            return ("seq", "Sequence", tuple(self.annotation(a) for a in args), False)
        if origin is dict or annotation is dict:
            return ("dict", tuple(self.annotation(a) for a in args))
        if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
            members = [(m.name, m.value) for m in annotation]
            if all(isinstance(v, (int, str, float, bool, type(None))) for _, v in members):
                self.enums[_qualname(annotation)] = members
                return ("enum", _qualname(annotation))
            return ("opaque",)
        if _is_dtype_class(annotation):
            return ("dtype",)
        if isinstance(annotation, type) and dataclasses.is_dataclass(annotation):
            self.cls(annotation)
            return ("dc", _qualname(annotation))
        if origin is typing.Callable or annotation is typing.Callable or "Callable" in str(origin):
            return ("callable",)
        return ("opaque",)

    def cls(self, cls: type) -> str:
        name = _qualname(cls)
        if name in self.classes:
            return name
        self.classes[name] = {}  # placeholder: classes may refer to themselves
        from overrides.coerce import field_types

        hints = field_types(cls)
        fields = []
        for f in dataclasses.fields(cls):
            if f.default is not dataclasses.MISSING:
                default = ("value", self.value(f.default))
            elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
                try:
                    default = ("factory", self.value(f.default_factory()))  # type: ignore[misc]
                except Exception:  # noqa: BLE001 - a factory that needs more: no default to reset to
                    default = ("missing",)
            else:
                default = ("missing",)
            fields.append((f.name, self.annotation(hints.get(f.name, Any)), default, f.init))
        self.classes[name] = {"name": cls.__name__, "qualname": cls.__qualname__, "module": cls.__module__,
                              "fields": fields, "bases": _bases(cls), "defines": _defined_methods(cls)}
        return name

    def value(self, value: Any) -> Any:
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        if isinstance(value, enum.Enum):
            self.annotation(type(value))
            if _qualname(type(value)) in self.enums:
                return ("E", _qualname(type(value)), value.name)
            return ("O", _qualname(type(value)), _text(value))
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            name = self.cls(type(value))
            return ("D", name, tuple((f.name, self.value(getattr(value, f.name, None)))
                                     for f in dataclasses.fields(value)))
        if isinstance(value, list):
            return ("L", tuple(self.value(v) for v in value))
        if isinstance(value, tuple) and type(value) is tuple:
            return ("T", tuple(self.value(v) for v in value))
        if isinstance(value, (set, frozenset)):
            return ("S", type(value).__name__, tuple(sorted((self.value(v) for v in value), key=repr)))
        if isinstance(value, dict) and type(value) is dict:
            return ("M", tuple((self.value(k), self.value(v)) for k, v in value.items()))
        if isinstance(value, PosixPath):
            return ("P", str(value))
        if _is_dtype(value):
            return ("Y", str(value), int(getattr(value, "itemsize", 4)))
        if isinstance(value, Opaque):
            return ("O", value.type_name, value.text)
        return ("O", _qualname(type(value)), _text(value))


def dump(cfg: Any, presets: dict[str, Any] | None = None) -> dict:
    """``cfg`` as plain data (see the module's doc); ``presets``: Megatron Bridge's mixed-precision presets by
    name (what the rules resolve ``mixed_precision=NAME`` to), kept alongside."""
    dumper = _Dumper()
    root = dumper.value(cfg)
    kept = None if presets is None else tuple((name, dumper.value(value)) for name, value in presets.items())
    return {"format": FORMAT, "root": root, "classes": dumper.classes, "enums": dumper.enums, "presets": kept}


def fingerprint(cfg: Any) -> str:
    """A hash of every value of ``cfg`` (a real config and its look-alike give the same one)."""
    return hashlib.sha256(repr(_Dumper().value(cfg)).encode()).hexdigest()


class _Loader:
    def __init__(self, data: dict):
        self.data = data
        self.classes: dict[str, type] = {}
        self.enums: dict[str, type] = {}
        self.stand_ins: dict[str, type] = {}

    def stand_in(self, module: str, qualname: str, name: str, methods: list[str]) -> type:
        """An empty class named as a base of a real class, noting the methods that base defines."""
        key = f"{module}.{qualname}"
        if key not in self.stand_ins:
            self.stand_ins[key] = type(name, (), {"__module__": module, "__qualname__": qualname,
                                                  DEFINES: frozenset(methods)})
        return self.stand_ins[key]

    def enum(self, name: str) -> type:
        if name not in self.enums:
            module, _, qualname = name.rpartition(".")
            self.enums[name] = enum.Enum(qualname, self.data["enums"][name], module=module, qualname=qualname)
        return self.enums[name]

    def annotation(self, spec: tuple) -> Any:
        kind = spec[0]
        if kind == "any":
            return Any
        if kind == "none":
            return type(None)
        if kind == "prim":
            return {"int": int, "float": float, "bool": bool, "str": str}[spec[1]]
        if kind == "path":
            return Path
        if kind == "literal":
            return Literal[spec[1]]
        if kind == "union":
            return Union[tuple(self.annotation(a) for a in spec[1])]
        if kind == "seq":
            _, container, inner, ellipsis = spec
            base = {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset,
                    "Sequence": typing.Sequence}[container]
            args = tuple(self.annotation(a) for a in inner)
            if not args:
                return base
            if ellipsis:
                return base[(*args, ...)]
            return base[args if container == "tuple" else args[0]]
        if kind == "dict":
            args = tuple(self.annotation(a) for a in spec[1])
            return dict[args] if len(args) == 2 else dict
        if kind == "enum":
            return self.enum(spec[1])
        if kind == "dtype":
            return _DType
        if kind == "dc":
            return self.cls(spec[1])
        if kind == "callable":
            return typing.Callable
        return OpaqueType

    def cls(self, name: str) -> type:
        if name in self.classes:
            return self.classes[name]
        info = self.data["classes"][name]
        fields = info["fields"]
        bases = tuple(self.stand_in(*base) for base in info["bases"])
        cls = dataclasses.make_dataclass(info["name"], [(f[0], Any) for f in fields], bases=bases,
                                         module=info["module"], namespace={DEFINES: frozenset(info["defines"])})
        cls.__qualname__ = info["qualname"]
        self.classes[name] = cls  # before the annotations: they may name this class
        annotations, dc_fields = {}, {}
        for fname, ann, default, init in fields:
            annotations[fname] = self.annotation(ann)
            if default[0] == "value":
                value = self.value(default[1])
                f = dataclasses.field(default_factory=lambda v=value: _copy(v)) if _mutable(value) \
                    else dataclasses.field(default=value)
            elif default[0] == "factory":
                f = dataclasses.field(default_factory=lambda d=default[1]: self.value(d))
            else:
                f = dataclasses.field()
            f.name, f.type, f._field_type = fname, annotations[fname], dataclasses._FIELD  # type: ignore[attr-defined]
            f.init = init
            dc_fields[fname] = f
        cls.__annotations__ = annotations
        cls.__dataclass_fields__ = dc_fields  # type: ignore[attr-defined]
        return cls

    def value(self, spec: Any) -> Any:
        if not isinstance(spec, tuple):
            return spec
        tag = spec[0]
        if tag == "D":
            cls = self.cls(spec[1])
            obj = object.__new__(cls)
            for name, value in spec[2]:
                object.__setattr__(obj, name, self.value(value))
            return obj
        if tag == "L":
            return [self.value(v) for v in spec[1]]
        if tag == "T":
            return tuple(self.value(v) for v in spec[1])
        if tag == "S":
            return (set if spec[1] == "set" else frozenset)(self.value(v) for v in spec[2])
        if tag == "M":
            return {self.value(k): self.value(v) for k, v in spec[1]}
        if tag == "E":
            return self.enum(spec[1])[spec[2]]
        if tag == "P":
            return Path(spec[1])
        if tag == "Y":
            return _DType(spec[1], spec[2])
        if tag == "O":
            return Opaque(spec[1], spec[2])
        raise ValueError(f"unknown snapshot tag {tag!r}")


def _mutable(value: Any) -> bool:
    return isinstance(value, (list, dict, set)) or dataclasses.is_dataclass(value)


def _copy(value: Any) -> Any:
    import copy

    return copy.deepcopy(value)


def load(data: dict) -> Any:
    """The look-alike config tree of ``dump``'s data."""
    return load_with_presets(data)[0]


def load_with_presets(data: dict) -> tuple[Any, dict[str, Any] | None]:
    """The look-alike config tree and the look-alike mixed-precision presets (None: not kept)."""
    if data.get("format") != FORMAT:
        raise ValueError("snapshot of another format")
    loader = _Loader(data)
    cfg = loader.value(data["root"])
    presets = data.get("presets")
    return cfg, None if presets is None else {name: loader.value(value) for name, value in presets}


def _unsupported(annotation: Any) -> bool:
    """Whether overriding a field of this annotation could go otherwise on the real config."""
    if annotation is OpaqueType or annotation is _DType or annotation is typing.Callable:
        return True
    if isinstance(annotation, type) and dataclasses.is_dataclass(annotation):
        return True
    return any(_unsupported(a) for a in typing.get_args(annotation) if a is not Ellipsis)


def answerable(cfg: Any, key: str) -> bool:
    """Whether an override of ``key`` on the look-alike ``cfg`` goes exactly as on the real config: every
    section on the way exists (nothing would be created) and the field's type is one the snapshot rebuilt.
    An unknown key is answerable (the refusal and its suggestions read only field names)."""
    from overrides.coerce import field_types

    node = cfg
    parts = key.split(".")
    for i, name in enumerate(parts):
        last = i == len(parts) - 1
        if isinstance(node, dict):
            if name not in node:
                return True
            if last:
                return not isinstance(node[name], (Opaque, _DType))
            node = node[name]
            continue
        if not dataclasses.is_dataclass(node):
            return True  # "is a value, not a section": the same words either way
        if name not in {f.name for f in dataclasses.fields(node)}:
            return True
        annotation = field_types(type(node)).get(name, Any)
        value = getattr(node, name)
        if last:
            return not _unsupported(annotation) and not isinstance(value, (Opaque, _DType))
        if value is None:
            return False  # '+section.key=...' would create a real section: its constructor may refuse
        node = value
    return True
