"""Write config/README.md from the config schema (workflow/schemas/config.schema.yaml), as the Snakemake workflow
catalog renders a workflow's config: every key, nested, with its type, whether it is required, its default and its
description. The schema is read as the config check reads it (``calibrl.config.schema``): the enums its ``$defs``
take from the code's registries, and each backend's GPU layout, are filled in.

    .venv/bin/python scripts/config_readme.py           # rewrite config/README.md (make docs)
    .venv/bin/python scripts/config_readme.py --check   # exit 1 if config/README.md is not what it would write

tests/test_docs.py fails when the committed file differs from what this writes.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "config" / "README.md"
COMMAND = "make docs (or .venv/bin/python scripts/config_readme.py)"
# $defs rendered as sections of their own (objects several keys refer to); the rest are rendered where they are used
SECTIONS = ("architecture", "hub_model", "layout", "layout_overlay")

HEADER = """# Configuration

<!-- Generated from workflow/schemas/config.schema.yaml by scripts/config_readme.py: edit the schema's descriptions,
then run `make docs`. tests/test_docs.py fails when this file is out of date. -->

{description}

A config file named on the command line is the whole config (nothing of the embedded default is merged underneath);
several are merged in order, so a second file can layer a change on the first. `config/config.yaml` is the embedded
default, `config/paper.yaml` the paper's grid on a GPU cluster, `config/cluster_smoke.yaml` a site's first run,
`config/rehearsal.yaml` the paper-scale path on CPU, `.test/config.yaml` the micro grid the workflow tests run.

`calibrl.config.validate` checks a config against this schema before any job (every problem with its key and the
rules that read it) and fills in the defaults below; a key without a default is optional (absent means none) unless
it is required. `<name>` stands for a key of the user's choosing. The analysis plan (`config/plan.yaml`) has no
schema: its keys are `calibrl.analysis_plan`'s ([docs/analysis.md](../docs/analysis.md)).
"""


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _prose(text: str) -> str:
    """A description as a table cell: ``<results>`` would be read as an HTML tag."""
    return re.sub(r"<(?=[A-Za-z/])", "&lt;", _cell(text))


def _literal(value) -> str:
    return value if isinstance(value, str) else json.dumps(value).replace('": ', ": ").replace('"', "")


def _bounds(node: dict) -> str:
    parts = []
    for key, sign in (("minimum", ">="), ("exclusiveMinimum", ">"), ("maximum", "<="), ("exclusiveMaximum", "<")):
        if key in node:
            parts.append(f"{sign} {_literal(node[key])}")
    if "pattern" in node:
        parts.append(f"matching `{node['pattern']}`")
    return ", ".join(parts)


def _ref_name(node: dict) -> str | None:
    ref = node.get("$ref")
    return ref.removeprefix("#/$defs/") if ref else None


class Renderer:
    def __init__(self, schema: dict):
        self.schema = schema
        self.defs = schema["$defs"]

    def type_of(self, node: dict) -> str:
        """A short type: ``integer >= 1``, ``one of `a`, `b```, ``list of string``, ``map of <name> -> ...``."""
        name = _ref_name(node)
        if name is not None:
            target = self.defs[name]
            if name in SECTIONS:
                return f"[{name}](#{name})"
            return self.type_of({**target, **{k: v for k, v in node.items() if k != "$ref"}})
        if "oneOf" in node:
            return " or ".join(self.type_of(alt) for alt in node["oneOf"])
        if "allOf" in node:
            parts = [self.type_of(part) for part in node["allOf"] if "$ref" in part]
            extra = [f"`{k}`" for part in node["allOf"] if "$ref" not in part for k in part.get("properties", {})]
            return " ".join(parts) + (f" with {', '.join(extra)}" if extra else "")
        if "enum" in node:
            return "one of " + ", ".join(f"`{_literal(v)}`" for v in node["enum"])
        kind = node.get("type", "any")
        if kind == "array":
            items = self.type_of(node.get("items", {}))
            extra = []
            if node.get("minItems", 0) > 1:
                extra.append(f"at least {node['minItems']}")
            elif node.get("minItems") == 1:
                extra.append("non-empty")
            if node.get("uniqueItems"):
                extra.append("unique")
            return f"list of {items}" + (f" ({', '.join(extra)})" if extra else "")
        if kind == "object" and isinstance(node.get("additionalProperties"), dict) and "properties" not in node:
            return f"map of `<name>` to {self.type_of(node['additionalProperties'])}"
        bounds = _bounds(node)
        kind = f"non-empty {kind}" if node.get("minLength") else kind
        return f"{kind} {bounds}" if bounds else kind

    def description(self, node: dict) -> str:
        """The key's own description, else that of the ``$defs`` entry it refers to."""
        if "description" in node:
            return node["description"]
        name = _ref_name(node)
        return self.defs[name].get("description", "") if name is not None else ""

    def rows(self, node: dict, prefix: str, required: bool) -> list[str]:
        """One table row for the key ``prefix`` and one for every key below it, depth first, in the schema's
        order. A ``$defs`` section is not expanded here (its row links to it)."""
        default = f"`{_literal(node['default'])}`" if "default" in node else ""
        out = []
        if prefix:
            cells = [f"`{prefix}`", _cell(self.type_of(node)), "yes" if required else "", _cell(default)]
            out.append("| " + " | ".join([*cells, _prose(self.description(node))]) + " |")
        if _ref_name(node) in SECTIONS:
            return out
        node = self._expand(node)
        children = node.get("properties", {})
        needed = set(node.get("required", []))
        for key, child in children.items():
            out += self.rows(child, f"{prefix}.{key}" if prefix else key, key in needed)
        extra = node.get("additionalProperties")
        if isinstance(extra, dict) and "properties" in self._expand(extra):
            out += self.rows(self._expand(extra), f"{prefix}.<name>", False)[1:]
        return out

    def _expand(self, node: dict) -> dict:
        name = _ref_name(node)
        return self.defs[name] if name is not None and name not in SECTIONS else node

    def table(self, node: dict, prefix: str = "") -> str:
        """The keys below ``prefix`` (``node`` itself has a heading of its own)."""
        head = "| key | type | required | default | description |\n|---|---|---|---|---|\n"
        rows = self.rows(node, prefix, False)[1 if prefix else 0 :]
        return head + "\n".join(rows) + "\n"


def _layouts() -> dict[str, dict]:
    """Each backend with a GPU layout: the config schema as the config check reads it for that trainer."""
    from calibrl import backends, config

    return {name: config.schema(trainer=name) for name in backends.names() if backends.get(name).gpu is not None}


def render() -> str:
    from calibrl import config

    schema = config.schema()
    r = Renderer(schema)
    out = [HEADER.format(description=_cell(schema["description"]))]
    for key, node in schema["properties"].items():
        req = " (required)" if key in schema.get("required", []) else ""
        out.append(f"## `{key}`{req}\n")
        if node.get("description"):
            out.append(_prose(node["description"]) + "\n")
        if "properties" in node:
            out.append(r.table(node, key))
        else:
            default = f", default `{_literal(node['default'])}`" if "default" in node else ""
            out.append(f"Type: {_cell(r.type_of(node))}{default}.\n")
    out.append("## Definitions\n\nKey sets several keys above refer to.\n")
    for name in SECTIONS:
        if name in ("layout", "layout_overlay"):
            for trainer, full in _layouts().items():
                node = full["$defs"][name]
                out.append(f"### {name}\n\nTrainer `{trainer}`: {_prose(node.get('description', ''))}\n")
                out.append(Renderer(full).table({k: v for k, v in node.items() if k != "description"}))
            continue
        node = schema["$defs"][name]
        out.append(f"### {name}\n")
        if node.get("description"):
            out.append(_prose(node["description"]) + "\n")
        out.append(r.table(node))
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if config/README.md is out of date")
    parser.add_argument("--out", type=Path, default=OUT, help="where to write (default: config/README.md)")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if not args.out.is_file() or args.out.read_text() != text:
            print(f"{args.out} is out of date: run {COMMAND}", file=sys.stderr)
            return 1
        return 0
    args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
