#!/usr/bin/env python3
"""Renders deploy/helm/coffer without helm (which neither Debian nor PyPI ships), for deploy/lint.sh.

It implements only the subset of Helm's Go templates the chart uses, the way Helm does it:
  {{ .Values.a.b }}  {{ .Release.Name }}  {{ .Release.Service }}  {{ .Chart.AppVersion }}
  {{- ... -}} (whitespace trimming)  {{/* comments */}}  {{ if X }} ... {{ else }} ... {{ end }}
  pipelines into: quote, toYaml, nindent N, indent N, sha256sum, required "msg" X, not X,
  eq A B, ne A B (two strings or two booleans only), int X, lt A B, gt A B (two ints only),
  fail "msg"
Anything else is an error rather than a guess, so a template it renders renders the same in helm.
eq and ne refuse numbers: helm's values are float64 and a template's literals int, which Go's
templates refuse to compare, so such a comparison would fail in helm. lt and gt compare only ints:
a literal, or a value converted by sprig's `int` (`.Values.n | int | lt 1` is 1 < n).
Stricter than helm on purpose: a missing value is an error (helm prints "<no value>"), and so is
printing a number of a million or more, which helm (values are float64) prints as 1e+06.

  deploy/helm_render.py CHART [-f VALUES]... [--name RELEASE] [--namespace NS]
prints every manifest like `helm template`; as a module, render_chart() returns them by file.
"""
import argparse
import copy
import hashlib
import json
import os
import re
import sys

import yaml


class RenderError(Exception):
    pass


class GoInt(int):
    """An int as Go's templates have it: a literal, or what sprig's `int` returns. A number read
    from values is not one (helm's values are float64), so lt and gt refuse it unconverted."""


ACTION = re.compile(r"\{\{(-[ \t\r\n])?(.*?)([ \t\r\n]-)?\}\}", re.S)
FUNCTIONS = {"quote", "toYaml", "nindent", "indent", "sha256sum", "required", "not", "eq", "ne", "fail",
             "int", "lt", "gt"}


def tokenize(text, where):
    """[("text", s) | ("action", inner, line)], with Helm's trim markers applied."""
    out, pos, trim_next = [], 0, False
    for m in ACTION.finditer(text):
        chunk = text[pos:m.start()]
        if trim_next:
            chunk = chunk.lstrip(" \t\r\n")
        if m.group(1):
            chunk = chunk.rstrip(" \t\r\n")
        out.append(("text", chunk))
        line = text.count("\n", 0, m.start()) + 1
        inner = m.group(2).strip()
        if not (inner.startswith("/*") and inner.endswith("*/")):
            out.append(("action", inner, f"{where}:{line}"))
        trim_next = bool(m.group(3))
        pos = m.end()
    chunk = text[pos:]
    out.append(("text", chunk.lstrip(" \t\r\n") if trim_next else chunk))
    if "{{" in "".join(t[1] for t in out if t[0] == "text"):
        raise RenderError(f"{where}: unterminated or malformed action")
    return out


def parse(tokens):
    """Nested list of text, ("expr", pipeline, where) and ("if", pipeline, where, then, else)."""
    root, stack = [], []
    cur = root
    for tok in tokens:
        if tok[0] == "text":
            cur.append(tok[1])
            continue
        inner, where = tok[1], tok[2]
        word = inner.split(None, 1)[0] if inner else ""
        if word == "if":
            node = ["if", inner[2:].strip(), where, [], []]
            cur.append(node)
            stack.append((node, cur))
            cur = node[3]
        elif word == "else":
            if inner != "else" or not stack or stack[-1][0][0] != "if" or cur is not stack[-1][0][3]:
                raise RenderError(f"{where}: unsupported or misplaced {inner!r}")
            cur = stack[-1][0][4]
        elif word == "end":
            if inner != "end" or not stack:
                raise RenderError(f"{where}: unexpected {inner!r}")
            cur = stack.pop()[1]
        elif word in ("range", "with", "define", "template", "include", "block", "else if") or ":=" in inner:
            raise RenderError(f"{where}: {word!r} is outside the subset deploy/helm_render.py renders")
        else:
            cur.append(["expr", inner, where])
    if stack:
        raise RenderError(f"{stack[-1][0][2]}: `if` without `end`")
    return root


def split_words(cmd, where):
    word = r'"(?:[^"\\]|\\.)*"|[^\s"]+'
    words = re.findall(word, cmd)
    if re.sub(word, "", cmd).strip():
        raise RenderError(f"{where}: cannot parse {cmd!r}")
    return words


def go_str(v, where):
    """What {{ v }} prints in helm, or an error where helm would print something surprising."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        if v != int(v) or abs(v) >= 1_000_000:
            raise RenderError(f"{where}: helm prints {v!r} in scientific notation; quote it in values")
        return str(int(v))
    if isinstance(v, str):
        return v
    raise RenderError(f"{where}: cannot print {type(v).__name__} {v!r} (use toYaml)")


def truthy(v):
    return not (v is None or v is False or v == 0 or v == "" or v == [] or v == {})


def to_yaml(v):
    # Helm: sigs.k8s.io/yaml (sorted keys), trailing newline trimmed.
    return yaml.safe_dump(v, default_flow_style=False, sort_keys=True, width=10**6).removesuffix("\n")


def indent(n, s):
    pad = " " * n
    return pad + s.replace("\n", "\n" + pad)


class Renderer:
    def __init__(self, scope):
        self.scope = scope

    def value(self, word, where):
        if word.startswith('"'):
            return json.loads(word)
        if re.fullmatch(r"-?\d+", word):
            return GoInt(word)
        if word in ("true", "false"):
            return word == "true"
        if word.startswith("."):
            v = self.scope
            for part in word[1:].split("."):
                if not isinstance(v, dict) or part not in v:
                    raise RenderError(f"{where}: no value {word} (define it in values.yaml)")
                v = v[part]
            return v
        raise RenderError(f"{where}: unknown word {word!r}")

    def call(self, fn, args, where):
        n = {"quote": 1, "toYaml": 1, "sha256sum": 1, "not": 1, "nindent": 2, "indent": 2, "required": 2,
             "eq": 2, "ne": 2, "fail": 1, "int": 1, "lt": 2, "gt": 2}[fn]
        if len(args) != n:
            raise RenderError(f"{where}: {fn} takes {n} arguments, got {len(args)}")
        if fn == "quote":
            return json.dumps(go_str(args[0], where), ensure_ascii=False)
        if fn == "toYaml":
            return to_yaml(args[0])
        if fn == "sha256sum":
            return hashlib.sha256(go_str(args[0], where).encode()).hexdigest()
        if fn == "not":
            return not truthy(args[0])
        if fn in ("eq", "ne"):
            a, b = args
            if not (isinstance(a, str) and isinstance(b, str) or isinstance(a, bool) and isinstance(b, bool)):
                raise RenderError(f"{where}: {fn} compares two strings or two booleans here, got {a!r} and {b!r}")
            return (a == b) == (fn == "eq")
        if fn == "int":
            v = args[0]
            if isinstance(v, str) and re.fullmatch(r"-?\d+", v.strip()):
                return GoInt(v.strip())
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v != int(v):
                raise RenderError(f"{where}: int wants a whole number here, got {v!r}")
            return GoInt(int(v))
        if fn in ("lt", "gt"):
            a, b = args
            if not (isinstance(a, GoInt) and isinstance(b, GoInt)):
                raise RenderError(f"{where}: {fn} compares two ints here (a literal, or `| int`), got {a!r} and {b!r}")
            return a < b if fn == "lt" else a > b
        if fn == "fail":
            if not isinstance(args[0], str):
                raise RenderError(f"{where}: fail wants a string")
            raise RenderError(f"{where}: fail: {args[0]}")
        if fn in ("nindent", "indent"):
            if not isinstance(args[0], int):
                raise RenderError(f"{where}: {fn} wants a number first")
            s = indent(args[0], go_str(args[1], where))
            return "\n" + s if fn == "nindent" else s
        if fn == "required":
            if args[1] is None or args[1] == "":
                raise RenderError(f"{where}: required: {args[0]}")
            return args[1]
        raise AssertionError(fn)

    def pipeline(self, text, where):
        result, first = None, True
        for cmd in re.split(r'\|(?=(?:[^"]*"[^"]*")*[^"]*$)', text):  # `|` outside quotes
            words = split_words(cmd.strip(), where)
            if not words:
                raise RenderError(f"{where}: empty command in {text!r}")
            if words[0] in FUNCTIONS:
                args = [self.value(w, where) for w in words[1:]] + ([] if first else [result])
                result = self.call(words[0], args, where)
            elif first and len(words) == 1:
                result = self.value(words[0], where)
            else:
                raise RenderError(f"{where}: unsupported command {cmd.strip()!r}")
            first = False
        return result

    def render(self, nodes):
        out = []
        for node in nodes:
            if isinstance(node, str):
                out.append(node)
            elif node[0] == "expr":
                out.append(go_str(self.pipeline(node[1], node[2]), node[2]))
            else:
                _, cond, where, then, other = node
                out.append(self.render(then if truthy(self.pipeline(cond, where)) else other))
        return "".join(out)


def merge(base, over):
    """Helm's values merge: maps deeply, anything else replaced."""
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else copy.deepcopy(v)
    return out


def load_values(chart, files=(), overrides=None):
    with open(os.path.join(chart, "values.yaml")) as f:
        values = yaml.safe_load(f) or {}
    for path in files:
        with open(path) as f:
            values = merge(values, yaml.safe_load(f) or {})
    return merge(values, overrides or {})


def render_chart(chart, values, name="coffer", namespace="default"):
    """{"templates/x.yaml": text} for every template, NOTES.txt included."""
    with open(os.path.join(chart, "Chart.yaml")) as f:
        meta = yaml.safe_load(f)
    chart_scope = {k[0].upper() + k[1:]: v for k, v in meta.items()}
    scope = {
        "Values": values,
        "Release": {"Name": name, "Namespace": namespace, "Service": "Helm"},
        "Chart": chart_scope,
    }
    out = {}
    tdir = os.path.join(chart, "templates")
    for fn in sorted(os.listdir(tdir)):
        if fn.startswith("_") or not fn.endswith((".yaml", ".yml", ".txt", ".tpl")):
            continue
        rel = f"templates/{fn}"
        with open(os.path.join(tdir, fn)) as f:
            text = f.read()
        out[rel] = Renderer(scope).render(parse(tokenize(text, rel)))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("chart")
    ap.add_argument("-f", "--values", action="append", default=[])
    ap.add_argument("--name", default="coffer")
    ap.add_argument("--namespace", default="default")
    a = ap.parse_args()
    try:
        rendered = render_chart(a.chart, load_values(a.chart, a.values), a.name, a.namespace)
    except RenderError as e:
        sys.exit(f"helm_render: {e}")
    chart_name = os.path.basename(os.path.normpath(a.chart))
    for rel, text in rendered.items():
        if rel.endswith("NOTES.txt") or not text.strip():
            continue
        print(f"---\n# Source: {chart_name}/{rel}\n{text.strip()}")


if __name__ == "__main__":
    main()
