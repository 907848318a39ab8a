"""Prototypes read from installed CANN headers, which may be messy C++ (``extern "C"``, attributes,
visibility macros, ``constexpr``, default arguments): the declarations of the wanted functions are
found in the text, everything around them is ignored, and each declaration is read by a small reader
of C declarations into the canonical form of :mod:`.prototypes`. Only the standard library is used: a
declaration this reader cannot read is reported as unreadable, never guessed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .prototypes import Param, Prototype, base_type, known_base_type, strip_header

_QUALIFIERS = frozenset("const volatile restrict __restrict __restrict__".split())
_BASE_WORDS = frozenset("signed unsigned char short int long float double void _Bool bool".split())
_TAGS = frozenset(("struct", "union", "enum"))
_DROP_WORDS = frozenset("extern static inline __inline __inline__ constexpr virtual explicit".split())
_TOKEN = re.compile(r"\s*(\.\.\.|[A-Za-z_]\w*|\d+|\S)")
_WORD = re.compile(r"[A-Za-z_]\w*")


# ---- reading one declaration ----------------------------------------------------------------------
def _tokens(text: str) -> list[str]:
    return _TOKEN.findall(text)


def _render(tokens: list[str]) -> str:
    """Declaration text as people write it: ``const char *name``, ``int a[]``, ``void (*fn)(int, int)``."""
    out = ""
    for t in tokens:
        if not out:
            out = t
        elif _WORD.match(t) and (_WORD.match(out[-1]) or out[-1] in "),"):
            out += " " + t
        elif t in "*(" and (_WORD.match(out[-1]) or out[-1] == ","):
            out += " " + t
        elif t == ",":
            out += ", "
        else:
            out += t
    return out


class _Declaration:
    """A recursive-descent reader of one C declaration (a parameter, a typedef's type, a return type):
    specifiers, then a declarator of pointers, a name or a parenthesised declarator, and array or
    parameter-list suffixes. ``read`` gives (name or None, canonical type)."""

    def __init__(self, text: str, typedefs: Mapping[str, str]) -> None:
        self.toks = _tokens(text)
        self.i = 0
        self.typedefs = typedefs

    def _peek(self) -> str:
        return self.toks[self.i] if self.i < len(self.toks) else ""

    def _take(self) -> str:
        t = self._peek()
        if not t:
            raise ValueError("the declaration ends early")
        self.i += 1
        return t

    def read(self) -> tuple[str | None, str]:
        name, canon = self._declarator(self._specifiers())
        if self.i != len(self.toks):
            raise ValueError(f"unexpected {self.toks[self.i]!r}")
        return name, canon

    def _specifiers(self) -> str:
        words: list[str] = []
        named: str | None = None
        while True:
            t = self._peek()
            if t in _QUALIFIERS:
                self.i += 1
            elif t in _BASE_WORDS and named is None:
                words.append(self._take())
            elif t in _TAGS and named is None and not words:
                self.i += 1
                tag = self._take()
                if not _WORD.fullmatch(tag):
                    raise ValueError(f"{t} without a name")
                named = "i32" if t == "enum" else f"{t} {tag}"
            elif _WORD.fullmatch(t) and named is None and not words:
                self.i += 1
                named = self._type_name(t)
            else:
                break
        if named is not None:
            return named
        if not words:
            raise ValueError(f"no type before {self._peek() or 'the end'!r}")
        return base_type(words)

    def _type_name(self, name: str) -> str:
        if name in self.typedefs:
            return self.typedefs[name]
        known = known_base_type(name)
        # a type the project does not declare can only be compared by name: the same opaque name on both sides
        return known if known is not None else f"struct __aclnnpy_{name}"

    def _declarator(self, base: str) -> tuple[str | None, str]:
        stars = 0
        while self._peek() == "*":
            self.i += 1
            stars += 1
            while self._peek() in _QUALIFIERS:
                self.i += 1
        inner_start: int | None = None
        name: str | None = None
        if self._peek() == "(" and self.i + 1 < len(self.toks) and self.toks[self.i + 1] in ("*", "("):
            inner_start = self.i + 1
            self._skip_group("(", ")")
        elif _WORD.fullmatch(self._peek()) and self._peek() not in _QUALIFIERS:
            name = self._take()
        suffixes: list[str | None] = []  # None: an array; text: a parameter list's canonical types
        while self._peek() in ("[", "("):
            if self._peek() == "[":
                self._skip_group("[", "]")
                suffixes.append(None)
            else:
                suffixes.append(self._parameter_types())
        canon = base + "*" * stars
        for suffix in reversed(suffixes):
            canon = canon + "*" if suffix is None else f"{canon}({suffix})"
        if inner_start is None:
            return name, canon
        # a parenthesised declarator (a pointer to a function or an array) applies around the suffixes
        end = self.i
        self.i = inner_start
        name, canon = self._declarator(canon)
        if self._peek() != ")":
            raise ValueError(f"unexpected {self._peek()!r} in a parenthesised declarator")
        self.i = end
        return name, canon

    def _skip_group(self, open_: str, close: str) -> None:
        depth = 0
        while True:
            t = self._take()
            depth += t == open_
            depth -= t == close
            if depth == 0:
                return

    def _parameter_types(self) -> str:
        start = self.i
        self._skip_group("(", ")")
        inner = self.toks[start + 1:self.i - 1]
        params = _split_tokens(inner)
        if params == [["void"]] or not params:
            return ""
        out = []
        for p in params:
            if p == ["..."]:
                continue  # a variadic function pointer's canonical form lists the named parameters
            out.append(_Declaration(" ".join(p), self.typedefs).read()[1])
        return ",".join(out)


def _split_tokens(tokens: list[str]) -> list[list[str]]:
    out: list[list[str]] = [[]]
    depth = 0
    for t in tokens:
        depth += t in "(["
        depth -= t in ")]"
        if t == "," and depth == 0:
            out.append([])
        else:
            out[-1].append(t)
    return [p for p in out if p]


def read_parameter(text: str, typedefs: Mapping[str, str], position: int) -> Param:
    """One parameter declaration as a :class:`Param` (unnamed ones are called ``arg<position>``);
    ValueError when it is not a declaration this reader understands."""
    if _tokens(text) == ["..."]:
        raise ValueError("a variadic function is not called through the run helpers")
    name, canon = _Declaration(text, typedefs).read()
    return Param(_render(_tokens(text)), name or f"arg{position}", canon)


def read_type(text: str, typedefs: Mapping[str, str]) -> str:
    """The canonical form of a type written without a name (a return type, a typedef's type)."""
    name, canon = _Declaration(text, typedefs).read()
    if name is not None:
        raise ValueError(f"unexpected {name!r}")
    return canon


# ---- finding declarations in a header --------------------------------------------------------------
def _remove_balanced(text: str, pattern: re.Pattern[str]) -> str:
    """Remove every match of `pattern` (which ends just before a '(') with its balanced (...) group."""
    while True:
        m = pattern.search(text)
        if not m:
            return text
        i = _skip_parens(text, m.end())
        if i < 0:
            return text[:m.start()]
        text = text[:m.start()] + " " + text[i:]


def _skip_parens(text: str, i: int) -> int:
    """Index just past the balanced group whose '(' is at or after i (whitespace skipped); -1 if unbalanced."""
    while i < len(text) and text[i].isspace():
        i += 1
    if i >= len(text) or text[i] != "(":
        return -1
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "(":
            depth += 1
        elif text[j] == ")":
            depth -= 1
            if depth == 0:
                return j + 1
    return -1


_ATTRIBUTE = re.compile(r"\b(__attribute__|__declspec|alignas|_Alignas)\s*(?=\()")
_MACRO_CALL = re.compile(r"\b[A-Z][A-Z0-9_]*\s*(?=\()")
_LOCAL_TYPEDEF = re.compile(r"\btypedef\s+([^;{}()]*?[\w*])\s*\b([A-Za-z_]\w*)\s*;")


def _denoise(text: str) -> str:
    """Drop what is not part of a C prototype: attributes, ``[[...]]``, ``extern "C"`` and string literals."""
    text = _remove_balanced(text, _ATTRIBUTE)
    text = re.sub(r"\[\[.*?\]\]", " ", text, flags=re.S)
    text = re.sub(r'extern\s*"C"', " ", text)
    return re.sub(r'"(?:[^"\\\n]|\\.)*"', " ", text)


def _return_tokens(prefix: str, known: Mapping[str, str]) -> list[str] | None:
    """The return type's tokens from the text between the previous declaration and the function
    name, or None when that text is not the start of a declaration (a call, an expression, a typedef)."""
    prefix = _remove_balanced(prefix, _MACRO_CALL)  # e.g. ACL_DEPRECATED_MESSAGE("...")
    if re.search(r"[^\w\s*]", prefix):
        return None
    kept = []
    for t in re.findall(r"[A-Za-z_]\w*|\*", prefix):
        if t in ("typedef", "return"):
            return None
        if t in _DROP_WORDS or (re.fullmatch(r"[A-Z][A-Z0-9_]*|__\w+", t) and t not in known):
            continue  # storage class / visibility or calling-convention macros
        kept.append(t)
    return kept if any(t != "*" for t in kept) else None


def _split_params(text: str) -> list[str]:
    out: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in text:
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        if ch == "," and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur))
    return [p.split("=")[0].strip() for p in out if p.strip()]  # C++ default arguments dropped


def _find(body: str, names: list[str], known: Mapping[str, str]) -> dict[str, tuple[list[str], list[str]]]:
    """name -> (return type tokens, parameter declarations) of the first declaration of each name."""
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, sorted(names, key=len, reverse=True))) + r")\s*(?=\()")
    found: dict[str, tuple[list[str], list[str]]] = {}
    for m in pattern.finditer(body):
        name = m.group(1)
        if name in found:
            continue
        start = max(body.rfind(c, 0, m.start()) for c in ";{}") + 1
        ret = _return_tokens(body[start:m.start()], known)
        end = _skip_parens(body, m.end())
        if ret is None or end < 0 or body[end:].lstrip()[:1] not in (";", "{"):
            continue  # a call, a function-pointer typedef, an expression: not the declaration
        found[name] = (ret, _split_params(body[body.index("(", m.end()) + 1:end - 1]))
    return found


@dataclass(frozen=True)
class Extracted:
    """A prototype found in an installed header, or why it could not be read."""

    header: str
    prototype: Prototype | None
    error: str = ""


def _local_typedefs(body: str, typedefs: Mapping[str, str]) -> dict[str, str]:
    """The project's typedefs, plus the header's own simple ones (``typedef void *rtStream_t;``) that
    the reader understands, in order (later ones may use earlier ones)."""
    known = dict(typedefs)
    for type_text, name in _LOCAL_TYPEDEF.findall(body):
        if name in typedefs or known_base_type(name) is not None:
            continue
        try:
            known[name] = read_type(type_text, known)
        except ValueError:
            continue  # left opaque: compared by name
    return known


def extract_prototypes(text: str, names: Iterable[str], typedefs: Mapping[str, str], header: str = "<header>",
                       ) -> dict[str, Extracted]:
    """The prototypes of `names` declared in the header `text` (first declaration of each). `typedefs`
    are the canonical forms of the project's typedef names; simple typedefs of other names in the same
    header are expanded too."""
    wanted = [n for n in set(names) if n in text]
    if not wanted:
        return {}
    body = _denoise(strip_header(text)[0])
    found = _find(body, wanted, typedefs)
    if not found:
        return {}
    known = _local_typedefs(body, typedefs)
    out: dict[str, Extracted] = {}
    for name, (ret, params) in found.items():
        decl = f"{' '.join(ret)} {name}({', '.join(params) or 'void'})"
        try:
            read = [read_parameter(p, known, i) for i, p in enumerate(params)
                    if not (i == 0 and len(params) == 1 and p.strip() == "void")]
            proto = Prototype(name, decl, _render(ret), read_type(" ".join(ret), known), tuple(read))
        except ValueError as exc:
            out[name] = Extracted(header, None, f"could not parse `{decl};`: {exc}")
            continue
        out[name] = Extracted(header, proto)
    return out
