"""An out-of-bounds sanitizer for meganeura's kernels, for the tests (not a test file).

It owns two things:
- `sanitize(wgsl)`: the kernel's WGSL rewritten so that every index into an array (storage
  buffers, workgroup arrays, private and function-scope arrays, and the vectors and matrices
  those hold or a kernel keeps in registers) goes through `oob_index(index, length, site)`, which
  returns the index clamped, so that the kernel still runs safely, and notes an index at or past
  the length; each compute invocation reports what it noted, where it ends, into one extra
  `read_write` storage buffer of atomics (`oob_flags`, bound at the binding after the kernel's
  last; layout in `helpers`). A site is one `[...]` of the source: the report names its array,
  its index expression, its function and line.
- `SanitizedExecutable`: a `meganeura.runtime.Executable` whose every kernel runs sanitized,
  built from the test side only (its own pipelines and bind groups: `Device.pipeline` is not
  used), and `out_of_bounds()`, every site of every kernel that indexed out of bounds during
  the steps run so far. `sanitized_program` makes a `Program` that runs one; `run_kernel` runs
  one hand-written kernel sanitized.

Why: with `MEGANEURA_UNCHECKED_KERNELS=1` on Dawn every kernel of the device runs without the
shader compiler's clamping, and a kernel that reads past an array's end and discards the value
(`select`) is then undefined behaviour, although its results match numpy. The sanitizer makes
such an access a test failure.

The rewriter is a bracket-matching pass over the style meganeura generates (codegen/*.py,
shaders/*.wgsl), with just enough of WGSL's types to know what is indexed and how long it is
(declared types, `alias`, structs, function return types, and `let`s initialised from a typed
expression). A subgroupMatrixLoad or subgroupMatrixStore indexes its array through an offset: the
offset is checked with the matrix's extent, its last element against the array's length.
Whatever it does not understand it refuses with SanitizerError rather than leave
an access unchecked: an identifier of unknown type indexed (a pointer, a `let` of a computed
value), the result of a builtin or of a parenthesised expression indexed, a `[` outside any
function or constant, bindings outside group 0, an `override` that indexes, a name of its own
(`oob_…`) already in the kernel. An index in a `const` initializer is left alone: the shader
compiler checks those when it creates the module.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

import numpy as np

from meganeura.codegen.kernel import Binding, KernelSpec
from meganeura.runtime import Executable
from meganeura.runtime.backend import wgpu

FLAGS = "oob_flags"
CHECK = "oob_index"
SPAN = "oob_span"
FLUSH = "oob_flush"
PREFIX = "oob_"
FIRST_WORDS = 3  # per site, after the bits: invocations whose first bad index was here, its largest, the length


def helpers(sites: int) -> str:
    """The WGSL of the check and of the flush, for a kernel of `sites` checked indices.

    Each invocation keeps what it saw in private memory: a bit per site that indexed out of
    bounds, and its first such (site, index, length). An entry point flushes them to the flags
    buffer where the invocation ends (before each `return`, and at its end): a few atomics per
    entry point, where an atomic per site under a branch made lavapipe's compiles of the unrolled
    GEMM kernels (hundreds of sites) slow (the ragged MLP's first step 16.7 s, against 3.2 s so
    and 1.9 s unsanitized, without Mesa's shader cache). An i32 index is reinterpreted as u32 at
    the site, so that a negative one shows as ≥ 2³¹ and is out of bounds like any other.
    Flags layout: the bits, `bits_of(sites)` words; then FIRST_WORDS words a site: the
    invocations whose first bad index was there, the largest such index, the length."""
    words = bits_of(sites)
    return f"""
var<private> oob_seen: array<u32, {words}>;
var<private> oob_first: vec3<u32>;  // (site + 1, index, length) of the invocation's first bad index

fn {CHECK}(index: u32, length: u32, site: u32) -> u32 {{
    let bad = index >= length;
    oob_seen[site / 32u] |= select(0u, 1u << (site % 32u), bad);
    oob_first = select(oob_first, vec3<u32>(site + 1u, index, length), bad && oob_first.x == 0u);
    return min(index, max(length, 1u) - 1u);
}}

// A subgroup matrix's load or store at `offset`: its last element, `span` − 1 past it, checked.
fn {SPAN}(offset: u32, span: u32, length: u32, site: u32) -> u32 {{
    _ = {CHECK}(offset + span - 1u, length, site);
    return min(offset, max(length, span) - span);
}}

fn {FLUSH}() {{
    for (var word = 0u; word < {words}u; word++) {{
        if (oob_seen[word] != 0u) {{
            atomicOr(&{FLAGS}[word], oob_seen[word]);
        }}
    }}
    if (oob_first.x != 0u) {{
        let at = {words}u + {FIRST_WORDS}u * (oob_first.x - 1u);
        atomicAdd(&{FLAGS}[at], 1u);
        atomicMax(&{FLAGS}[at + 1u], oob_first.y);
        atomicMax(&{FLAGS}[at + 2u], oob_first.z);
    }}
}}
"""


def bits_of(sites: int) -> int:
    """The words of the flags buffer that hold a bit per site (one at least)."""
    return max(1, -(-sites // 32))


def flags_words(sites: int) -> int:
    return bits_of(sites) + FIRST_WORDS * sites


class SanitizerError(ValueError):
    """A kernel construct the rewriter does not understand (it refuses rather than skip an access)."""


# ---------------------------------------------------------------------------------------------
# Lexing


@dataclass(frozen=True)
class Token:
    kind: str  # "id", "num" or "op"
    text: str
    start: int
    end: int


# `<`, `>` and `=` are single tokens even where WGSL writes `>>`, `>=` or `<=`: in a type the
# `>>` of `array<vec4<f32>>` closes two templates, and nothing here reads a comparison or a shift.
TOKEN = re.compile(
    r"(?P<ws>\s+)"
    r"|(?P<num>0[xX][0-9a-fA-F]+[iu]?|(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?[fhiu]?)"
    r"|(?P<id>[A-Za-z_][A-Za-z0-9_]*)"
    r"|(?P<op>->|[-+*/%&|^!~<>=()\[\]{}.,;:@])"
)
OPENERS = {"(": ")", "[": "]", "{": "}"}
# Builtins that index an array without brackets, through a pointer to it and an offset: the offset
# is checked with the matrix's extent (`Rewriter.matrix_site`).
OFFSET_BUILTINS = ("subgroupMatrixLoad", "subgroupMatrixStore")
SUBGROUP_MATRICES = ("subgroup_matrix_left", "subgroup_matrix_right", "subgroup_matrix_result")


def masked_comments(text: str) -> str:
    """`text` with every comment's characters (not its newlines) made spaces: offsets are kept,
    so that the edits found in the masked text apply to the original."""
    out, i, n = list(text), 0, len(text)
    while i < n:
        if text.startswith("//", i):
            while i < n and text[i] != "\n":
                out[i] = " "
                i += 1
        elif text.startswith("/*", i):  # WGSL's block comments nest
            depth = 0
            while i < n:
                if text.startswith("/*", i):
                    depth += 1
                    out[i] = out[i + 1] = " "
                    i += 2
                elif text.startswith("*/", i):
                    depth -= 1
                    out[i] = out[i + 1] = " "
                    i += 2
                    if depth == 0:
                        break
                else:
                    out[i] = out[i] if text[i] == "\n" else " "
                    i += 1
        else:
            i += 1
    return "".join(out)


def tokens_of(masked: str) -> list[Token]:
    """The tokens of comment-free WGSL; an unknown character is an error."""
    tokens, i = [], 0
    while i < len(masked):
        match = TOKEN.match(masked, i)
        if match is None:
            raise SanitizerError(f"line {line_of(masked, i)}: unexpected character {masked[i]!r}")
        if match.lastgroup != "ws":
            tokens.append(Token(match.lastgroup, match.group(), match.start(), match.end()))
        i = match.end()
    return tokens


def matching_brackets(tokens: list[Token], masked: str) -> dict[int, int]:
    """Each bracket's token index → its partner's, both ways, for (), [] and {}."""
    pairs: dict[int, int] = {}
    stack: list[int] = []
    for index, token in enumerate(tokens):
        if token.text in OPENERS:
            stack.append(index)
        elif token.text in OPENERS.values():
            if not stack or OPENERS[tokens[stack[-1]].text] != token.text:
                raise SanitizerError(f"line {line_of(masked, token.start)}: unbalanced {token.text!r}")
            opener = stack.pop()
            pairs[opener], pairs[index] = index, opener
    if stack:
        raise SanitizerError(f"line {line_of(masked, tokens[stack[-1]].start)}: unclosed {tokens[stack[-1]].text!r}")
    return pairs


def line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


# ---------------------------------------------------------------------------------------------
# Types: as far as indexing cares


@dataclass(frozen=True)
class Type:
    """What a value is for indexing: an array (its `length` text; None where runtime-sized), a
    vector or matrix (`length` its components or columns), or something not indexable."""

    kind: str  # "array", "vec", "mat", "struct", "ptr", "scalar", "atomic", "submatrix" or "other"
    element: Type | None = None
    length: str | None = None
    name: str = ""

    @property
    def indexable(self) -> bool:
        return self.kind in ("array", "vec", "mat")


SCALARS = ("f32", "f16", "i32", "u32", "bool")
SHORT_VECTOR = re.compile(r"^vec([234])([fhiu])$")
SHORT_MATRIX = re.compile(r"^mat([234])x([234])([fh])$")
LONG_VECTOR = re.compile(r"^vec([234])$")
LONG_MATRIX = re.compile(r"^mat([234])x([234])$")
SUFFIX_SCALARS = {"f": "f32", "h": "f16", "i": "i32", "u": "u32"}


def vector(count: str, scalar: str) -> Type:
    return Type("vec", Type("scalar", name=scalar), count)


def matrix(columns: str, rows: str, scalar: str) -> Type:
    return Type("mat", vector(rows, scalar), columns)


def subgroup_matrix(columns: str, rows: str, scalar: str) -> Type:
    """A subgroup matrix (`subgroup_matrix_left<T, K, M>`: K columns, M rows; right<T, N, K> and
    result<T, N, M> likewise, columns first): `length` its columns, `name` its rows."""
    return Type("submatrix", Type("scalar", name=scalar), columns, rows)


Span = tuple[int, int]  # tokens [start, end)


@dataclass
class Function:
    """A function's parameters and return type as written (token spans) and its body."""

    name: str
    params: list[tuple[str, Span]]
    returns: Span | None
    body: tuple[int, int]  # token indices of its `{` and `}`
    entry: bool  # a compute entry point: where an invocation ends, its record is flushed


@dataclass
class Scope:
    names: dict[str, Type | None]
    kind: str  # "function", "block" or "for" (a for header's, closed with its body)


# ---------------------------------------------------------------------------------------------
# The rewriter


@dataclass(frozen=True)
class Site:
    """One checked `[...]` of a kernel's source."""

    array: str  # the indexed expression as written: "tile_a", or "tile_a[k * 8u + m]" for its vec4
    index: str  # the index expression as written
    length: str  # what it is checked against: "arrayLength(&x0)", a declared length ("BK * BM / 4u"), "4"
    function: str
    line: int

    def __str__(self) -> str:
        return f"{self.array}[{self.index}] (fn {self.function}, line {self.line}, length {self.length})"


@dataclass(frozen=True)
class Sanitized:
    """A kernel rewritten by `sanitize`: its WGSL, its checked sites (site k is bit k of the
    flags buffer, and has FIRST_WORDS words after the bits: `helpers`) and the flags' binding."""

    wgsl: str
    sites: tuple[Site, ...]
    binding: int


class Rewriter:
    """One kernel's declarations, scopes and index sites; `sanitized()` is the rewritten kernel."""

    def __init__(self, wgsl: str) -> None:
        self.text = wgsl
        self.masked = masked_comments(wgsl)
        self.tokens = tokens_of(self.masked)
        self.pairs = matching_brackets(self.tokens, self.masked)
        for token in self.tokens:
            if token.kind == "id" and token.text.startswith(PREFIX):
                raise SanitizerError(f"the kernel already uses the sanitizer's prefix {PREFIX!r}: {token.text}")
        self.aliases: dict[str, tuple[int, int]] = {}  # name → the token span of its type
        self.structs: dict[str, dict[str, tuple[int, int]]] = {}
        self.globals: dict[str, Type | None] = {}
        self.global_spans: dict[str, Span | None] = {}  # a global's type annotation
        self.initializers: dict[str, Span] = {}  # an unannotated module-scope const's initializer
        self.bindings: dict[str, tuple[int, int]] = {}  # storage name → (group, binding)
        self.functions: dict[str, Function] = {}
        self.sites: list[Site] = []
        self.edits: list[tuple[int, int, str]] = []  # (offset, order, text)
        self.lengths: dict[str, str] = {}  # a fixed array's length text → the const that holds it
        self.element_of: dict[int, tuple[Type | None, int]] = {}  # a site's `]` → (element, start)
        self.scopes: list[Scope] = []
        self.function = ""
        self.read_module()
        for function in self.functions.values():
            self.walk(function)

    # -- module scope ---------------------------------------------------------------------

    def where(self, index: int) -> str:
        index = min(index, len(self.tokens) - 1)
        return f"line {line_of(self.masked, self.tokens[index].start)}"

    def text_of(self, first: int, last: int) -> str:
        """The source of tokens first..last (inclusive)."""
        if last < first:
            return ""
        return self.masked[self.tokens[first].start : self.tokens[last].end]

    def expect(self, index: int, text: str) -> int:
        if index >= len(self.tokens) or self.tokens[index].text != text:
            got = self.tokens[index].text if index < len(self.tokens) else "the end"
            raise SanitizerError(f"{self.where(index)}: expected {text!r}, got {got!r}")
        return index + 1

    def name_at(self, index: int) -> str:
        if index >= len(self.tokens) or self.tokens[index].kind != "id":
            raise SanitizerError(f"{self.where(index)}: expected a name")
        return self.tokens[index].text

    def statement_end(self, index: int) -> int:
        """The index of the `;` that ends the statement going on at `index` (skipping brackets)."""
        while index < len(self.tokens) and self.tokens[index].text != ";":
            if self.tokens[index].text in OPENERS:
                index = self.pairs[index]
            elif self.tokens[index].text in ("}", ")", "]"):
                raise SanitizerError(f"{self.where(index)}: a statement without its ';'")
            index += 1
        if index >= len(self.tokens):
            raise SanitizerError("a statement without its ';' at the end of the kernel")
        return index

    def attributes(self, index: int) -> tuple[dict[str, str], int]:
        """The `@name(args)` attributes from `index`: {name: args text}, and the index after them."""
        found = {}
        while index < len(self.tokens) and self.tokens[index].text == "@":
            name = self.name_at(index + 1)
            index += 2
            args = ""
            if index < len(self.tokens) and self.tokens[index].text == "(":
                close = self.pairs[index]
                args = self.text_of(index + 1, close - 1)
                index = close + 1
            found[name] = args
        return found, index

    def read_module(self) -> None:
        """Every module-scope declaration: aliases, structs, globals, functions (in any order, as WGSL allows)."""
        index = 0
        tokens = self.tokens
        while index < len(tokens):
            attributes, index = self.attributes(index)
            if index >= len(tokens):
                break
            word = tokens[index].text
            if word in ("enable", "requires", "diagnostic"):
                index = self.statement_end(index) + 1
            elif word == ";":
                index += 1
            elif word == "alias":
                name = self.name_at(index + 1)
                start = self.expect(index + 2, "=")
                end = self.statement_end(start)
                self.aliases[name] = (start, end)
                index = end + 1
            elif word == "struct":
                index = self.read_struct(index)
            elif word in ("const", "override"):
                index = self.read_constant(index, word)
            elif word == "var":
                index = self.read_global(index, attributes)
            elif word == "fn":
                index = self.read_function(index, attributes)
            else:
                raise SanitizerError(f"{self.where(index)}: a module-scope declaration it does not know: {word!r}")

    def read_struct(self, index: int) -> int:
        name = self.name_at(index + 1)
        open_ = self.expect(index + 2, "{") - 1
        self.structs[name] = dict(self.typed_names(open_))
        return self.pairs[open_] + 1

    def read_constant(self, index: int, word: str) -> int:
        name = self.name_at(index + 1)
        at = index + 2
        annotated = None
        if self.tokens[at].text == ":":
            end = self.type_end(at + 1)
            annotated = (at + 1, end)
            at = end
        end = self.statement_end(at)
        indexes = any(self.tokens[i].text == "[" for i in range(at, end))
        if word == "override" and indexes:  # a const's indices are checked when the module is made
            raise SanitizerError(f"{self.where(at)}: an override {name!r} whose initializer indexes")
        self.global_spans[name] = annotated
        self.globals[name] = None  # typed lazily (it may name a struct or alias declared later)
        if annotated is None and self.tokens[at].text == "=":
            self.initializers[name] = (at + 1, end)
        return end + 1

    def read_global(self, index: int, attributes: dict[str, str]) -> int:
        at = index + 1
        space = ""
        if self.tokens[at].text == "<":
            close = self.template_close(at)
            space = self.text_of(at + 1, close - 1).replace(" ", "")
            at = close + 1
        name = self.name_at(at)
        at = self.expect(at + 1, ":")
        end = self.type_end(at)
        self.global_spans[name] = (at, end)
        self.globals[name] = None
        if space.startswith(("storage", "uniform")):
            if "group" not in attributes or "binding" not in attributes:
                raise SanitizerError(f"{self.where(index)}: {name} has no @group/@binding")
            self.bindings[name] = (int(attributes["group"], 0), int(attributes["binding"], 0))
        elif space not in ("workgroup", "private"):
            raise SanitizerError(f"{self.where(index)}: a module-scope var<{space}> it does not know ({name})")
        statement = self.statement_end(end)
        if any(self.tokens[i].text == "[" for i in range(end, statement)):
            raise SanitizerError(f"{self.where(end)}: a module-scope initializer that indexes ({name})")
        return statement + 1

    def typed_names(self, open_: int) -> list[tuple[str, tuple[int, int]]]:
        """The `name: type` entries (each after its attributes, comma-separated) between the bracket
        at token `open_` and its pair: a struct's fields, a function's parameters; each name with
        the token range of its type."""
        close, at, entries = self.pairs[open_], open_ + 1, []
        while at < close:
            _, at = self.attributes(at)
            name = self.name_at(at)
            at = self.expect(at + 1, ":")
            end = self.type_end(at)
            entries.append((name, (at, end)))
            at = end + (1 if self.tokens[end].text == "," else 0)
        return entries

    def read_function(self, index: int, attributes: dict[str, str]) -> int:
        name = self.name_at(index + 1)
        open_ = self.expect(index + 2, "(") - 1
        params = self.typed_names(open_)
        at = self.pairs[open_] + 1
        returns = None
        if self.tokens[at].text == "->":
            _, at = self.attributes(at + 1)
            end = self.type_end(at)
            returns = (at, end)
            at = end
        body_open = self.expect(at, "{") - 1
        body = (body_open, self.pairs[body_open])
        self.functions[name] = Function(name, params, returns, body, "compute" in attributes)
        return self.pairs[body_open] + 1

    # -- types ----------------------------------------------------------------------------

    def template_close(self, index: int) -> int:
        """The `>` that closes the template whose `<` is token `index`."""
        depth = 0
        while index < len(self.tokens):
            text = self.tokens[index].text
            if text == "<":
                depth += 1
            elif text == ">":
                depth -= 1
                if depth == 0:
                    return index
            elif text in ("(", "["):
                index = self.pairs[index]
            elif text in (";", "{", "}", ")", "]"):
                break
            index += 1
        raise SanitizerError(f"{self.where(index)}: an unclosed template")

    def type_end(self, index: int) -> int:
        """The index after the type that starts at `index` (a name, with its template if any)."""
        self.name_at(index)
        if index + 1 < len(self.tokens) and self.tokens[index + 1].text == "<":
            return self.template_close(index + 1) + 1
        return index + 1

    def template_args(self, open_: int, close: int) -> list[tuple[int, int]]:
        """The token spans [start, end) of a template's arguments, split at its top-level commas."""
        args, start, at = [], open_ + 1, open_ + 1
        while at < close:
            text = self.tokens[at].text
            if text == "<":
                at = self.template_close(at)
            elif text in ("(", "["):
                at = self.pairs[at]
            elif text == ",":
                args.append((start, at))
                start = at + 1
            at += 1
        if start < close:
            args.append((start, close))
        return args

    def type_at(self, span: tuple[int, int] | None, seen: tuple[str, ...] = ()) -> Type | None:
        """The Type of the type written at token span [start, end) (None: no annotation)."""
        if span is None:
            return None
        start, end = span
        name = self.name_at(start)
        args = self.template_args(start + 1, end - 1) if end - start > 1 else []
        if name == "array":
            if not args:
                raise SanitizerError(f"{self.where(start)}: an array type without its element type")
            element = self.type_at(args[0], seen)
            length = self.text_of(args[1][0], args[1][1] - 1) if len(args) > 1 else None
            return Type("array", element, length)
        if name in SCALARS:
            return Type("scalar", name=name)
        if short := SHORT_VECTOR.match(name):
            return vector(short.group(1), SUFFIX_SCALARS[short.group(2)])
        if short := SHORT_MATRIX.match(name):
            return matrix(short.group(1), short.group(2), SUFFIX_SCALARS[short.group(3)])
        if long := LONG_VECTOR.match(name):
            return vector(long.group(1), self.text_of(args[0][0], args[0][1] - 1) if args else "f32")
        if long := LONG_MATRIX.match(name):
            return matrix(long.group(1), long.group(2), self.text_of(args[0][0], args[0][1] - 1) if args else "f32")
        if name in SUBGROUP_MATRICES:
            if len(args) != 3:
                raise SanitizerError(f"{self.where(start)}: {name} without its element type, columns and rows")
            scalar, columns, rows = (self.text_of(a, b - 1) for a, b in args)
            return subgroup_matrix(columns, rows, scalar)
        if name == "atomic":
            return Type("atomic", self.type_at(args[0], seen) if args else None)
        if name == "ptr":
            return Type("ptr")
        if name in self.aliases:
            if name in seen:
                raise SanitizerError(f"{self.where(start)}: alias {name} refers to itself")
            return self.type_at(self.aliases[name], (*seen, name))
        if name in self.structs:
            return Type("struct", name=name)
        return Type("other", name=name)

    def global_type(self, name: str) -> Type | None:
        if self.globals[name] is None and self.global_spans.get(name) is not None:
            self.globals[name] = self.type_at(self.global_spans[name])
        elif self.globals[name] is None and name in self.initializers:
            scopes, self.scopes = self.scopes, []  # typed at module scope
            self.globals[name] = self.inferred(*self.initializers.pop(name))
            self.scopes = scopes
        return self.globals[name]

    def member(self, base: Type | None, field: str, at: int) -> Type | None:
        """The type of `base.field`: a struct's field or a vector's swizzle."""
        if base is None:
            return None
        if base.kind == "struct":
            fields = self.structs[base.name]
            if field not in fields:
                raise SanitizerError(f"{self.where(at)}: struct {base.name} has no field {field}")
            return self.type_at(fields[field])
        if base.kind == "vec" and re.fullmatch(r"[xyzw]{1,4}|[rgba]{1,4}", field):
            scalar = base.element.name if base.element else "f32"
            return base.element if len(field) == 1 else vector(str(len(field)), scalar)
        return None

    # -- function bodies --------------------------------------------------------------------

    def lookup(self, name: str, at: int) -> Type | None:
        for scope in reversed(self.scopes):
            if name in scope.names:
                return scope.names[name]
        if name in self.globals:
            return self.global_type(name)
        raise SanitizerError(f"{self.where(at)}: {name!r} is indexed but not declared where the rewriter can see it")

    def is_local(self, name: str) -> bool:
        return any(name in scope.names for scope in self.scopes)

    def walk(self, function: Function) -> None:
        """Find the index sites of one function, keeping its scopes to type what is indexed."""
        self.function = function.name
        self.scopes = [Scope({name: self.type_at(span) for name, span in function.params}, "function")]
        open_, close = function.body
        pending: list[tuple[int, str, Type | None, int]] = []  # (its `;`, name, annotated type, after it)
        skip_until = -1  # a const's initializer: compile-time indices
        index = open_ + 1
        while index < close:
            token = self.tokens[index]
            text = token.text
            if text == "{":
                self.scopes.append(Scope({}, "block"))
            elif text == "}":
                self.scopes.pop()
                if self.scopes and self.scopes[-1].kind == "for":
                    self.scopes.pop()
            elif text == "for" and token.kind == "id":
                self.scopes.append(Scope({}, "for"))
            elif text in ("var", "let", "const") and token.kind == "id":
                end, name, type_, index = self.declaration(index)
                pending.append((end, name, type_, index))
                if text == "const":
                    skip_until = end
                continue
            elif text == ";":
                # A name is in scope after its declaration's `;`, not in its own initializer; and
                # its initializer is typed there, once the indices in it have been seen.
                for declaration in [d for d in pending if d[0] == index]:
                    _, name, type_, at = declaration
                    if type_ is None and self.tokens[at].text == "=":
                        type_ = self.inferred(at + 1, index)
                    self.scopes[-1].names[name] = type_
                    pending.remove(declaration)
            elif text == "[":
                self.site(index, checked=index > skip_until)
            elif text in OFFSET_BUILTINS and token.kind == "id":
                self.matrix_site(index, checked=index > skip_until)
            elif text == "return" and function.entry:  # a statement of a block: WGSL's if bodies are braced
                self.edits.append((token.start, 1, f"{FLUSH}(); "))
            index += 1
        if function.entry:
            self.edits.append((self.tokens[close].start, 0, f"    {FLUSH}();\n"))
        self.scopes = []

    def declaration(self, index: int) -> tuple[int, str, Type | None, int]:
        """A `var`/`let`/`const` at `index`: (the index of its `;`, its name, its annotated type,
        the index after the annotation: its `=` if any, the walk goes on from there, since the
        initializer's indices are sites too)."""
        at = index + 1
        if self.tokens[at].text == "<":  # var<function>
            at = self.template_close(at) + 1
        name = self.name_at(at)
        at += 1
        type_ = None
        if self.tokens[at].text == ":":
            end = self.type_end(at + 1)
            type_ = self.type_at((at + 1, end))
            if type_ is not None and type_.kind == "array" and type_.length is not None:
                shadowed = [w for w in re.findall(r"[A-Za-z_]\w*", type_.length) if self.is_local(w)]
                if shadowed:  # its length is evaluated at module scope (`length_const`)
                    raise SanitizerError(f"{self.where(at)}: array {name}'s length names local {shadowed}")
            at = end
        return self.statement_end(at), name, type_, at

    def inferred(self, start: int, end: int) -> Type | None:
        """The type of the initializer at tokens [start, end) where it is one typed postfix
        expression (a constructor, a call of a kernel function, an indexed or member chain of a
        known name); None otherwise (indexing that name is then refused)."""
        try:
            type_, first = self.postfix_type(end - 1)
        except SanitizerError:
            return None
        return type_ if first == start else None

    def postfix_type(self, last: int) -> tuple[Type | None, int]:
        """The type of the postfix expression that ends at token `last`, and its first token."""
        token = self.tokens[last]
        if token.kind == "id":
            if last > 0 and self.tokens[last - 1].text == ".":
                base, first = self.postfix_type(last - 2)
                return self.member(base, token.text, last), first
            return self.lookup(token.text, last), last
        if token.text == "]":
            if last not in self.element_of:
                raise SanitizerError(f"{self.where(last)}: an index the rewriter did not see")
            return self.element_of[last]
        if token.text == ")":
            return self.call_type(last)
        raise SanitizerError(f"{self.where(last)}: indexes something it cannot type: {token.text!r}")

    def call_type(self, close: int) -> tuple[Type | None, int]:
        """The type of `f(...)`, `T(...)`, `T<…>(...)` or `(expr)` ending at `)` token `close`."""
        open_ = self.pairs[close]
        before = open_ - 1
        if before >= 0 and self.tokens[before].kind == "id":
            name = self.tokens[before].text
            if name in self.functions:
                return self.type_at(self.functions[name].returns), before
            if name in SCALARS or name in self.aliases or name in self.structs:
                return self.type_at((before, before + 1)), before
            if SHORT_VECTOR.match(name) or SHORT_MATRIX.match(name):
                return self.type_at((before, before + 1)), before
            raise SanitizerError(f"{self.where(before)}: indexes the result of {name}(…), whose type it does not know")
        if before >= 0 and self.tokens[before].text == ">":
            start = self.template_start(before)
            if start is not None:
                name = self.tokens[start].text
                if name == "bitcast":
                    (arg,) = self.template_args(start + 1, before)
                    return self.type_at(arg), start
                return self.type_at((start, before + 1)), start
            raise SanitizerError(f"{self.where(before)}: indexes a call it cannot read")
        inner, first = self.postfix_type(close - 1)
        if first != open_ + 1:
            raise SanitizerError(f"{self.where(open_)}: indexes a parenthesised expression it cannot type")
        return inner, open_

    def template_start(self, close: int) -> int | None:
        """The type name whose template ends at `>` token `close` (None: no template there)."""
        depth, at = 0, close
        while at >= 0:
            text = self.tokens[at].text
            if text == ">":
                depth += 1
            elif text == "<":
                depth -= 1
                if depth == 0:
                    break
            elif text in (";", "{", "}", "(", "="):
                return None
            elif text in (")", "]"):
                at = self.pairs[at]
            at -= 1
        if at <= 0 or self.tokens[at - 1].kind != "id":
            return None
        start = at - 1
        name = self.tokens[start].text
        known = ("array", "atomic", "bitcast") + SCALARS + SUBGROUP_MATRICES
        if name not in known and not LONG_VECTOR.match(name) and not LONG_MATRIX.match(name):
            return None
        return start if self.template_close(at) == close else None

    def site(self, open_: int, checked: bool) -> None:
        """Type what `[` token `open_` indexes; where checked, make its index go through CHECK."""
        close = self.pairs[open_]
        base, first = self.postfix_type(open_ - 1)
        array = self.text_of(first, open_ - 1)
        if base is None:
            raise SanitizerError(
                f"{self.where(open_)}: cannot tell the type of {array!r} (fn {self.function}), so not its length"
            )
        if not base.indexable:
            raise SanitizerError(f"{self.where(open_)}: indexes {array!r} of type {base.kind} {base.name}".rstrip())
        self.element_of[close] = (base.element, first)
        if not checked:
            return
        length = self.length_of(base, first, open_ - 1)
        number = len(self.sites)
        index_text = self.text_of(open_ + 1, close - 1)
        line = line_of(self.masked, self.tokens[open_].start)
        self.sites.append(Site(array, index_text, base.length or length, self.function, line))
        self.edits.append((self.tokens[open_].end, 1, f"{CHECK}(u32("))
        self.edits.append((self.tokens[close].start, 0, f"), {length}, {number}u)"))

    def matrix_site(self, at: int, checked: bool) -> None:
        """A subgroupMatrixLoad<M>(&array, offset, column_major, stride) or subgroupMatrixStore(
        &array, offset, value, column_major, stride) at token `at`: its offset goes through SPAN,
        which checks the matrix's last element, (rows − 1)·stride + columns − 1 past the offset
        (columns and rows swapped where column-major), against the array's length."""
        name = self.tokens[at].text
        open_ = at + 1
        matrix = None
        if name == "subgroupMatrixLoad":
            if self.tokens[open_].text != "<":
                raise SanitizerError(f"{self.where(at)}: {name} without its matrix type")
            close = self.template_close(open_)
            (written,) = self.template_args(open_, close)
            matrix = self.type_at(written)
            open_ = close + 1
        if self.tokens[open_].text != "(":
            raise SanitizerError(f"{self.where(at)}: {name} not called")
        args = self.template_args(open_, self.pairs[open_])  # split at the call's top-level commas
        if len(args) != (4 if name == "subgroupMatrixLoad" else 5):
            raise SanitizerError(f"{self.where(at)}: {name} with {len(args)} arguments")
        (pointer, pointer_end), (first, end) = args[0], args[1]
        if self.tokens[pointer].text != "&":
            raise SanitizerError(f"{self.where(pointer)}: {name} of something other than &array")
        base, start = self.postfix_type(pointer_end - 1)
        if start != pointer + 1 or base is None or base.kind != "array":
            raise SanitizerError(f"{self.where(pointer)}: {name} of {self.text_of(pointer, pointer_end - 1)!r}")
        if name == "subgroupMatrixStore":
            value_first, value_end = args[2]
            matrix, value_start = self.postfix_type(value_end - 1)
            if value_start != value_first:
                raise SanitizerError(f"{self.where(value_first)}: {name} of a value it cannot type")
        if matrix is None or matrix.kind != "submatrix":
            raise SanitizerError(f"{self.where(at)}: {name} of a matrix whose shape it cannot tell")
        major = self.text_of(args[-2][0], args[-2][1] - 1)
        if major not in ("true", "false"):
            raise SanitizerError(f"{self.where(args[-2][0])}: {name} whose column_major is not a literal")
        stride = self.text_of(args[-1][0], args[-1][1] - 1)
        across, along = (matrix.length, matrix.name) if major == "true" else (matrix.name, matrix.length)
        span = f"(u32({across}) - 1u) * u32({stride}) + u32({along})"
        if not checked:
            return
        length = self.length_of(base, pointer + 1, pointer_end - 1)
        number = len(self.sites)
        array, offset = self.text_of(pointer + 1, pointer_end - 1), self.text_of(first, end - 1)
        line = line_of(self.masked, self.tokens[at].start)
        self.sites.append(Site(array, f"{offset} … + {span}", base.length or length, self.function, line))
        self.edits.append((self.tokens[first].start, 0, f"{SPAN}(u32("))
        self.edits.append((self.tokens[end - 1].end, 0, f"), {span}, {length}, {number}u)"))

    def length_of(self, base: Type, first: int, last: int) -> str:
        """The WGSL expression of the length of `base` (written at tokens first..last)."""
        if base.kind in ("vec", "mat"):
            return f"{base.length}u"
        if base.length is not None:
            return self.length_const(base.length)
        path = self.text_of(first, last)
        if not re.fullmatch(r"[A-Za-z_]\w*(\s*\.\s*[A-Za-z_]\w*)*", path):
            raise SanitizerError(f"{self.where(first)}: a runtime-sized array reached through {path!r}")
        root = self.tokens[first].text
        if self.is_local(root) or root not in self.bindings:
            raise SanitizerError(f"{self.where(first)}: a runtime-sized array {path!r} that is not a storage binding")
        return f"arrayLength(&{path})"

    def length_const(self, text: str) -> str:
        """A module-scope const holding a fixed array's declared length (evaluated where the
        module's consts are: a local const shadowing one of them is refused at the declaration)."""
        if text not in self.lengths:
            self.lengths[text] = f"{PREFIX}length_{len(self.lengths)}"
        return self.lengths[text]

    # -- output -----------------------------------------------------------------------------

    def flags_binding(self) -> int:
        """The binding after the kernel's last; every binding must be in group 0."""
        groups = {group for group, _ in self.bindings.values()}
        if groups - {0}:
            raise SanitizerError(f"bindings outside group 0: groups {sorted(groups)}")
        return max((binding for _, binding in self.bindings.values()), default=-1) + 1

    def sanitized(self, binding: int | None = None) -> Sanitized:
        """The kernel with its indices checked, its flags at `binding` (default: after its last)."""
        after_last = self.flags_binding()
        binding = after_last if binding is None else binding
        taken = {b for _, b in self.bindings.values()}
        if binding in taken:
            raise SanitizerError(f"binding {binding} is the kernel's own")
        pieces, done = [], 0
        for offset, _, insert in sorted(self.edits, key=lambda e: (e[0], e[1])):
            pieces += [self.text[done:offset], insert]
            done = offset
        text = "".join(pieces) + self.text[done:]
        lengths = "".join(f"const {name}: u32 = u32({length});\n" for length, name in self.lengths.items())
        declaration = f"@group(0) @binding({binding}) var<storage, read_write> {FLAGS}: array<atomic<u32>>;\n"
        tail = f"\n// ---- bounds checks (tests/bounds_check.py)\n{declaration}{lengths}{helpers(len(self.sites))}"
        return Sanitized(text + tail, tuple(self.sites), binding)


def sanitize(wgsl: str, binding: int | None = None) -> Sanitized:
    """`wgsl` with every index checked (module docstring), its flags buffer at `binding` (by
    default the one after the kernel's last). Raises SanitizerError on what it does not understand."""
    return Rewriter(wgsl).sanitized(binding)


# ---------------------------------------------------------------------------------------------
# Running a compiled step sanitized


@dataclass(frozen=True)
class OutOfBounds:
    """One site of one dispatch that indexed out of bounds in the steps run: with the invocations
    for which it was the first bad index, the largest such index and the length it was checked
    against (0, 0, 0 where every invocation that went out of bounds there had already done so elsewhere)."""

    label: str
    entry_point: str
    node: int
    site: Site
    first_in: int
    index: int
    length: int

    def __str__(self) -> str:
        where = f"kernel %{self.node} {self.label!r} ({self.entry_point}): {self.site}"
        if not self.first_in:
            return f"{where}: out of bounds (each time after an earlier bad index)"
        index = self.index - 2**32 if self.index >= 2**31 else self.index  # a negative i32, as u32
        return (
            f"{where}: index up to {index} against length {self.length}, first bad index of {self.first_in} invocations"
        )


@dataclass
class Check:
    """One dispatch run sanitized: its kernel, the rewritten kernel and its flags buffer."""

    spec: KernelSpec
    sanitized: Sanitized
    flags: object  # wgpu.GPUBuffer

    def out_of_bounds(self, device) -> list[OutOfBounds]:
        """The sites that indexed out of bounds so far, from the flags buffer (waits for the GPU)."""
        sites, spec = self.sanitized.sites, self.spec
        words = np.frombuffer(device.queue.read_buffer(self.flags, 0, self.flags.size), np.uint32)
        bits = np.unpackbits(words[: bits_of(len(sites))].view(np.uint8), bitorder="little")
        first = words[bits_of(len(sites)) :].reshape(-1, FIRST_WORDS)
        return [
            OutOfBounds(spec.label, spec.entry_point, spec.node, sites[n], *(int(w) for w in first[n]))
            for n in np.flatnonzero(bits[: len(sites)])
        ]


# Pipelines of sanitized kernels, made once per process (lavapipe compiles slowly), by what
# makes them: the device, the rewritten WGSL, the entry point and the bindings' accesses.
PIPELINES: dict[tuple, tuple] = {}
SANITIZED: dict[str, Sanitized] = {}


def sanitized_of(spec: KernelSpec) -> Sanitized:
    """`spec`'s kernel sanitized, its flags after its bindings (cached by its WGSL)."""
    key = f"{len(spec.bindings)}\n{spec.wgsl}"
    if key not in SANITIZED:
        try:
            SANITIZED[key] = sanitize(spec.wgsl, binding=len(spec.bindings))
        except SanitizerError as error:
            raise SanitizerError(f"kernel {spec.label!r} ({spec.entry_point}): {error}") from error
    return SANITIZED[key]


def sanitized_pipeline(device, spec: KernelSpec, sanitized: Sanitized) -> tuple:
    """(pipeline, bind group layout) of a sanitized kernel: the spec's bindings, then the flags."""
    accesses = tuple(b.access for b in spec.bindings)
    key = (id(device), sanitized.wgsl, spec.entry_point, accesses)
    if key not in PIPELINES:
        types = ["read-only-storage" if access == "read" else "storage" for access in accesses] + ["storage"]
        layout = device.device.create_bind_group_layout(
            entries=[
                {"binding": index, "visibility": wgpu.ShaderStage.COMPUTE, "buffer": {"type": kind}}
                for index, kind in enumerate(types)
            ]
        )
        module = device.device.create_shader_module(code=sanitized.wgsl)
        pipeline = device.device.create_compute_pipeline(
            layout=device.device.create_pipeline_layout(bind_group_layouts=[layout]),
            compute={"module": module, "entry_point": spec.entry_point},
        )
        PIPELINES[key] = (pipeline, layout, device)  # the device kept alive with its pipelines
    pipeline, layout, _ = PIPELINES[key]
    return pipeline, layout


def flags_buffer(device, spec: KernelSpec, sanitized: Sanitized):
    """A zeroed flags buffer for one dispatch of a sanitized kernel (WebGPU zeroes new buffers)."""
    usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC
    size = 4 * flags_words(len(sanitized.sites))
    return device.device.create_buffer(label=f"bounds flags %{spec.node}", size=size, usage=usage)


class SanitizedExecutable(Executable):
    """An Executable whose every dispatch runs its kernel sanitized, with a flags buffer of its
    own; `out_of_bounds()` reads them all. Only `prepare_dispatch` differs: it binds as
    Executable.prepare_dispatch does (each binding the value's bytes, or the whole buffer with
    canaries), plus the flags buffer."""

    def __init__(self, *args, **kwargs) -> None:
        self.checks: list[Check] = []
        super().__init__(*args, **kwargs)

    def prepare_dispatch(self, spec: KernelSpec) -> tuple:
        sanitized = sanitized_of(spec)
        pipeline, layout = sanitized_pipeline(self.device, spec, sanitized)
        flags = flags_buffer(self.device, spec, sanitized)
        entries = self.binding_entries(spec)
        entries.append({"binding": sanitized.binding, "resource": {"buffer": flags, "offset": 0, "size": flags.size}})
        self.checks.append(Check(spec, sanitized, flags))
        group = self.device.device.create_bind_group(layout=layout, entries=entries)
        return pipeline, group, spec.grid

    def out_of_bounds(self) -> list[OutOfBounds]:
        """Every site of every dispatch that indexed out of bounds so far (waits for the GPU)."""
        return [found for check in self.checks for found in check.out_of_bounds(self.device)]

    @property
    def entry_points(self) -> set[str]:
        """The entry points of the kernels this executable runs."""
        return {check.spec.entry_point for check in self.checks}


def sanitized_program(compilation):
    """A `meganeura.compiler.Program` of `compilation` (compile_plan's) whose executable is a
    SanitizedExecutable: Program makes `runtime.Executable`, swapped for the construction."""
    from meganeura import runtime
    from meganeura.compiler import Program

    original = runtime.Executable
    runtime.Executable = SanitizedExecutable
    try:
        return Program(compilation)
    finally:
        runtime.Executable = original


def sanitizer_target(target):
    """`target` with one storage binding fewer per kernel: the sanitizer binds its flags there."""
    return dataclasses.replace(target, max_storage_buffers=target.max_storage_buffers - 1)


def run_kernel(
    wgsl: str, entry_point: str, arrays: list[tuple[str, np.ndarray, str]], grid: tuple[int, int, int]
) -> tuple[dict[str, np.ndarray], list[OutOfBounds]]:
    """A hand-written kernel run once, sanitized, on the default device: its bindings `arrays`
    ((name, value, "read" or "read_write"), at bindings 0, 1, …). The read_write arrays' values
    after the dispatch, by name, and the sites that indexed out of bounds."""
    from meganeura.runtime import default_device

    device = default_device()
    bindings = tuple(Binding(name, -1, access) for name, _, access in arrays)
    spec = KernelSpec(-1, "hand-written", wgsl, entry_point, bindings, grid, (1, 1, 1))
    sanitized = sanitized_of(spec)
    pipeline, layout = sanitized_pipeline(device, spec, sanitized)
    usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST
    buffers = [
        device.device.create_buffer_with_data(data=np.ascontiguousarray(v).tobytes(), usage=usage) for _, v, _ in arrays
    ]
    flags = flags_buffer(device, spec, sanitized)
    entries = [{"binding": i, "resource": {"buffer": b, "offset": 0, "size": b.size}} for i, b in enumerate(buffers)]
    entries.append({"binding": sanitized.binding, "resource": {"buffer": flags, "offset": 0, "size": flags.size}})
    encoder = device.device.create_command_encoder()
    compute = encoder.begin_compute_pass()
    compute.set_pipeline(pipeline)
    compute.set_bind_group(0, device.device.create_bind_group(layout=layout, entries=entries))
    compute.dispatch_workgroups(*grid)
    compute.end()
    device.queue.submit([encoder.finish()])
    written = {
        name: np.frombuffer(device.queue.read_buffer(buffer), value.dtype).reshape(value.shape)
        for (name, value, access), buffer in zip(arrays, buffers, strict=True)
        if access == "read_write"
    }
    return written, Check(spec, sanitized, flags).out_of_bounds(device)
