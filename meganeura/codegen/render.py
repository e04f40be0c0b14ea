"""WGSL templates: find one (in the installed package, or in a checkout's top-level `shaders/`),
load it and specialise it.

A template is WGSL with two kinds of holes, both filled by `render`:
- `{{NAME}}` placeholders, replaced by text (sizes, index expressions, binding declarations);
- blocks between `//#if NAME` and `//#endif` lines (with an optional `//#else`), kept when
  NAME is true. They are WGSL comments, so a template still reads as WGSL.
A line `//#include NAME` is replaced by the text of `shaders/NAME.wgsl`, so that helper functions
several kernel families share (a workgroup reduction) are written once.
A placeholder or flag left unfilled is an error: a half-specialised kernel must never reach
the shader compiler, where the message would point at generated text instead of the cause.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

from meganeura.codegen.expressions import F32_BITS, F32_BITS_HELPER
from meganeura.codegen.random import RANDOM_CALL, RANDOM_HELPERS

PACKAGE_DIR = Path(__file__).resolve().parents[1]
# Where the templates are, in order: inside the package, where a wheel or `pip install .` puts the
# repository's shaders/ (setup.py maps it to `meganeura.shaders`); then the checkout's top-level
# shaders/, for the source tree and editable installs. The package's comes first so that an
# installed meganeura never reads the templates of some checkout that happens to sit above it.
SHADER_DIRS = (PACKAGE_DIR / "shaders", PACKAGE_DIR.parent / "shaders")

PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
DIRECTIVE = re.compile(r"^\s*//#(if|else|endif)\b\s*([A-Za-z_][A-Za-z0-9_]*)?\s*$")
INCLUDE = re.compile(r"^[ \t]*//#include[ \t]+([A-Za-z_][A-Za-z0-9_]*)[ \t]*$", re.MULTILINE)


class TemplateError(ValueError):
    """A template could not be specialised: an unknown flag, a leftover placeholder, bad nesting."""


def template_path(name: str) -> Path:
    """The file of template `name`: `<name>.wgsl` in the first of SHADER_DIRS that has it."""
    for folder in SHADER_DIRS:
        path = folder / f"{name}.wgsl"
        if path.is_file():
            return path
    installed, checkout = (folder / f"{name}.wgsl" for folder in SHADER_DIRS)
    raise TemplateError(
        f"no WGSL template {name!r}: neither {installed} (an installed package) nor {checkout} (a checkout) "
        "exists (if meganeura is installed, its package lacks the templates: build it from the repository, "
        "whose setup.py maps shaders/ into it, with `pip install .`)"
    )


@functools.cache
def load_template(name: str) -> str:
    """The text of `shaders/<name>.wgsl`, with its `//#include`s replaced."""
    return INCLUDE.sub(lambda match: load_template(match.group(1)), template_path(name).read_text())


def select_blocks(text: str, flags: dict[str, bool], template: str) -> str:
    """The template's lines with `//#if` blocks resolved by `flags`."""
    kept: list[str] = []
    stack: list[tuple[str, bool, bool]] = []  # (flag, parent_active, branch_taken)
    active = True
    for number, line in enumerate(text.splitlines(keepends=True), start=1):
        match = DIRECTIVE.match(line)
        if match is None:
            if active:
                kept.append(line)
            continue
        kind, flag = match.groups()
        if kind == "if":
            if flag not in flags:
                raise TemplateError(f"{template}.wgsl:{number}: no value given for flag {flag!r}")
            stack.append((flag, active, bool(flags[flag])))
            active = active and bool(flags[flag])
        elif not stack:
            raise TemplateError(f"{template}.wgsl:{number}: //#{kind} without //#if")
        elif kind == "else":
            flag, parent, taken = stack[-1]
            active = parent and not taken
        else:
            _, active, _ = stack.pop()
    if stack:
        raise TemplateError(f"{template}.wgsl: //#if {stack[-1][0]} is never closed")
    return "".join(kept)


def render(template: str, values: dict[str, str | int | bool]) -> str:
    """Template `template` with its blocks selected and its placeholders filled from `values`."""
    flags = {k: v for k, v in values.items() if isinstance(v, bool)}
    text = select_blocks(load_template(template), flags, template)

    def fill(match: re.Match) -> str:
        name = match.group(1)
        if name not in values or isinstance(values[name], bool):
            raise TemplateError(f"{template}.wgsl: no value given for placeholder {{{{{name}}}}}")
        return str(values[name])

    return with_special_values(PLACEHOLDER.sub(fill, text))


def with_special_values(wgsl: str) -> str:
    """`wgsl` with the definition of the helper that spells NaN and ±inf (codegen/expressions.py
    `literal`) appended where it calls it, and the Philox helpers where it draws random values
    (codegen/random.py)."""
    if f"{F32_BITS}(" in wgsl:
        wgsl += "\n" + F32_BITS_HELPER + "\n"
    if RANDOM_CALL in wgsl:
        wgsl += "\n" + load_template(RANDOM_HELPERS)
    return wgsl
