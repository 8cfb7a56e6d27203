#!/usr/bin/env python3
"""gen_capi_docs.py renders include/nexar.h's doc comments as a markdown
page: the C API reference of the documentation site. The header is the one
source: `mkdocs build` runs this (scripts/mkdocs_hooks.py) and nothing is
copied by hand.

    python3 scripts/gen_capi_docs.py [include/nexar.h] > c-api.md

Each comment directly followed by declarations (no blank line between)
documents them; a section banner (/* ---- Title ---- */) starts a section,
and its text documents the declarations in it that have no comment of their
own; other comments are prose. It fails if a function the header declares has no
doc comment, so an undocumented addition breaks the docs build.
"""

from __future__ import annotations

import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEADER = os.path.join(ROOT, "include", "nexar.h")

BANNER = re.compile(r"^\s*-{8,}\s*$")
SKIP_COMMENT = re.compile(r"^\s*@(generated|end)\b")
STARTS_PARA = re.compile(r"^(Args|Result|Results|Thread-safety|Common results|In place|Note)\b[^:]*:")


def _comments_and_code(text: str):
    """Yield ('comment', lines) and ('code', lines) chunks and ('blank',)."""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        s = line.strip()
        if s.startswith("/*"):
            body = [line]
            while "*/" not in lines[i]:
                i += 1
                body.append(lines[i])
            i += 1
            yield ("comment", body)
            continue
        if not s:
            yield ("blank", None)
            i += 1
            continue
        code = []
        while i < len(lines) and lines[i].strip() and not lines[i].strip().startswith("/*"):
            code.append(lines[i])
            i += 1
        yield ("code", code)


def _comment_text(body):
    """The text of a block comment, one string per line, leading ' * ' removed."""
    out = []
    for n, line in enumerate(body):
        s = line.rstrip()
        if n == 0:
            s = s.lstrip()[2:]
        if s.endswith("*/"):
            s = s[:-2]
        s = re.sub(r"^\s*\*(?!/) ?", "", s) if n > 0 else s.lstrip()
        out.append(s.rstrip())
    while out and not out[0].strip():
        out.pop(0)
    while out and not out[-1].strip():
        out.pop()
    return out


def _esc(s: str) -> str:
    # Keep `code` spans; escape what markdown would read as emphasis or links.
    parts = re.split(r"(`[^`]*`)", s)
    for k in range(0, len(parts), 2):
        p = parts[k].replace("\\", "\\\\").replace("*", "\\*").replace("_", "\\_")
        p = p.replace("[", "\\[").replace("<", "&lt;").replace(">", "&gt;")
        parts[k] = p
    return "".join(parts)


def _prose(lines):
    """Comment lines to markdown paragraphs and lists."""
    paras, cur = [], []
    for raw in lines:
        s = raw.strip()
        underline = re.fullmatch(r"-{3,}", s)
        if underline and cur:
            title = cur.pop()
            if cur:
                paras.append(" ".join(cur))
            cur = []
            paras.append("#### " + _esc(title))
            continue
        if not s:
            if cur:
                paras.append(" ".join(cur))
            cur = []
            continue
        # an item of an indented list of constants ("  NEXAR_ON_FAILURE_ABORT (the default): ...")
        item = raw.startswith("  ") and not raw.startswith("   ") and re.match(r"[A-Z][A-Z0-9_]{5,}\b[^:]*:", s)
        if s.startswith("- ") or STARTS_PARA.match(s) or item:
            if cur:
                paras.append(" ".join(cur))
            cur = ["- " + s if item else s]
            continue
        cur.append(s)
    if cur:
        paras.append(" ".join(cur))
    out = []
    for p in paras:
        if p.startswith("#### "):
            out.append(p)
        elif p.startswith("- "):
            out.append("- " + _esc(p[2:]))
        else:
            out.append(_esc(p))
    # consecutive list items stay one list; everything else is a paragraph
    md = []
    for k, p in enumerate(out):
        if md and not (p.startswith("- ") and out[k - 1].startswith("- ")):
            md.append("")
        md.append(p)
    return "\n".join(md)


def _declared_names(code):
    """Names a group of declaration lines declares, in order."""
    names = []
    stmt = ""
    code = re.sub(r"/\*.*?\*/", "", "\n".join(code), flags=re.S).splitlines()
    for line in code:
        s = line.strip()
        if s.startswith("#"):
            m = re.match(r"#\s*define\s+(\w+)", s)
            if m:
                names.append(m.group(1))
            continue
        stmt += " " + s
        if ";" not in s or stmt.count("{") != stmt.count("}"):
            continue  # a statement ends at a ';' outside braces
        st = stmt.strip()
        stmt = ""
        m = re.search(r"\(\s*\*\s*(\w+)\s*\)\s*\(", st)
        if st.startswith("typedef") and m:
            names.append(m.group(1))
        elif st.startswith("typedef"):
            m = re.search(r"(\w+)\s*;\s*$", st)
            if m:
                names.append(m.group(1))
        else:
            m = re.search(r"(\w+)\s*\(", st)
            if m:
                names.append(m.group(1))
    return names


def _functions(code):
    return [n for n in _declared_names(code) if n.startswith("nexar_") and not n.endswith("_t")
            and not n.endswith("_fn")]


def render(path: str = HEADER) -> str:
    text = open(path, encoding="utf-8").read()
    chunks = list(_comments_and_code(text))
    out = [
        "# C API reference",
        "",
        "Generated from `include/nexar.h` by `scripts/gen_capi_docs.py` when the site is built: the",
        "header is the one source of this page. C++ users: `bindings/cpp/include/nexar/nexar.hpp` wraps",
        "these functions (see the [C and C++ guide](../guides/c-cpp.md)).",
        "",
    ]
    undocumented = []
    first = True
    section_prose = False  # the current section's banner documents its declarations
    pending = None  # a comment waiting to see whether code follows it directly
    for k, ch in enumerate(chunks):
        kind = ch[0]
        if kind == "comment":
            t = _comment_text(ch[1])
            if t and SKIP_COMMENT.match(t[0]):
                continue  # go generate's markers: the comment before them still documents the code after
            if pending is not None:
                out += [_prose(pending), ""]
            pending = None
            if first:
                first = False
                out += ["## Overview", "", _prose(t), ""]
                continue
            if t and BANNER.match(t[0]):
                title = t[1].strip() if len(t) > 1 else ""
                out += ["## " + _esc(title), ""]
                rest = t[3:] if len(t) > 2 and BANNER.match(t[2]) else t[2:]
                while rest and (BANNER.match(rest[-1]) or not rest[-1].strip()):
                    rest = rest[:-1]
                section_prose = bool(rest)
                if rest:
                    out += [_prose(rest), ""]
                continue
            pending = t
        elif kind == "blank":
            if pending is not None:
                out += [_prose(pending), ""]
            pending = None
        else:
            code = ch[1]
            if all(l.strip().startswith("#") and not l.strip().startswith("#define") for l in code) or \
                    code[0].strip().startswith(("extern", "}", "#ifndef", "#include", "#ifdef", "#endif")):
                if pending is not None:
                    out += [_prose(pending), ""]
                pending = None
                continue
            names = _declared_names(code)
            if pending is None:
                if not section_prose:
                    undocumented += _functions(code)
                if names:
                    out += ["### " + ", ".join(names), "", "```c", *code, "```", ""]
                continue
            title = ", ".join(names) if names else "declarations"
            out += ["### " + title, "", "```c", *code, "```", "", _prose(pending), ""]
            pending = None
    if undocumented:
        raise SystemExit(f"gen_capi_docs: functions without a doc comment in {path}: {', '.join(undocumented)}")
    return "\n".join(out).rstrip() + "\n"


if __name__ == "__main__":
    sys.stdout.write(render(sys.argv[1] if len(sys.argv) > 1 else HEADER))
