"""mkdocs hooks: the reference pages' tables are generated from the code at every build, so they
cannot drift from it. A page asks for one with a line ``<!-- generated: NAME -->``."""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"^<!-- generated: ([a-z]+) -->$", re.M)


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _field_comments(path: Path, class_name: str) -> dict[str, str]:
    """The comment lines just above each field of a class, joined: the settings' documentation
    lives beside the settings."""
    source = path.read_text(encoding="utf-8")
    lines = source.splitlines()
    [cls] = [
        n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == class_name
    ]
    found: dict[str, str] = {}
    before: ast.AnnAssign | None = None
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            said: list[str] = []
            row = node.lineno - 2
            while row >= 0 and lines[row].strip().startswith("#"):
                said.insert(0, lines[row].strip().lstrip("#").strip())
                row -= 1
            if not said and before is not None and before.end_lineno == node.lineno - 1:
                # a field right under another shares its comment ("X, and Y")
                said = [found[before.target.id]]  # type: ignore[union-attr]
            found[node.target.id] = " ".join(said)
            before = node
        else:
            before = None
    return found


def settings_table() -> str:
    from saga_shared.config import Settings

    said = _field_comments(ROOT / "shared/config.py", "Settings")
    rows = ["| Variable | Default | What it sets |", "|---|---|---|"]
    for name, field in Settings.model_fields.items():
        default = field.default
        shown = f"`{default}`" if default not in ("", None) else "(empty)"
        rows.append(f"| `SAGA_{name.upper()}` | {_cell(shown)} | {_cell(said.get(name, ''))} |")
    return "\n".join(rows)


def _type_of(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        return str(schema["$ref"]).rsplit("/", 1)[-1]
    if "anyOf" in schema:
        return " or ".join(_type_of(s) for s in schema["anyOf"])
    if "enum" in schema:
        return " / ".join(f"`{v}`" for v in schema["enum"])
    if "const" in schema:
        return f"`{schema['const']}`"
    if schema.get("type") == "array":
        return f"list of {_type_of(schema.get('items', {}))}"
    return str(schema.get("type", "any"))


def messages_tables() -> str:
    out: list[str] = []
    for path in sorted((ROOT / "schemas").glob("*.json")):
        if path.name == "asyncapi.json":
            continue
        schema = json.loads(path.read_text(encoding="utf-8"))
        required = set(schema.get("required", ()))
        out += [
            f"### `{path.stem}`",
            "",
            f"`{schema.get('title', path.stem)}`, from `schemas/{path.name}`.",
            "",
            "| Field | Type | Required |",
            "|---|---|---|",
        ]
        for name, spec in schema.get("properties", {}).items():
            mark = "yes" if name in required else ""
            out.append(f"| `{name}` | {_cell(_type_of(spec))} | {mark} |")
        out.append("")
    return "\n".join(out)


def metrics_table() -> str:
    from prometheus_client.metrics import MetricWrapperBase

    from saga_shared.observability import metrics

    found = [m for m in vars(metrics).values() if isinstance(m, MetricWrapperBase)]
    rows = ["| Metric | Type | Labels | What it counts |", "|---|---|---|---|"]
    for metric in sorted(found, key=lambda m: m._name):
        kind = metric._type
        name = metric._name + ("_total" if kind == "counter" else "")
        labels = ", ".join(metric._labelnames)
        rows.append(f"| `{name}` | {kind} | {labels} | {_cell(metric._documentation)} |")
    return "\n".join(rows)


def payments_api() -> str:
    from typing import cast

    from starlette.routing import Route

    from saga_services.payments_http import api

    routes = [r for r in api.create_app(cast(Any, None)).routes if isinstance(r, Route)]
    rows = ["| Method | Path |", "|---|---|"]
    for route in routes:
        for method in sorted((route.methods or set()) - {"HEAD"}):
            rows.append(f"| `{method}` | `{route.path}` |")
    doc = (api.__doc__ or "").strip()
    return "\n".join(rows) + "\n\nFrom `services/payments_http/api.py`:\n\n" + doc


GENERATORS: dict[str, Callable[[], str]] = {
    "paymentsapi": payments_api,
    "settings": settings_table,
    "messages": messages_tables,
    "metrics": metrics_table,
}


def on_files(files: Any, config: Any, **_: Any) -> Any:
    """The benchmark's report and plots are published from where ``scripts/bench.sh`` writes
    them (benchmarks/results/), under results/benchmark/, rather than copied."""
    from mkdocs.structure.files import File

    for path in sorted((ROOT / "benchmarks/results").iterdir()):
        uri = f"results/benchmark/{path.name}"
        files.append(File.generated(config, uri, abs_src_path=str(path)))
    return files


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    if page.file.src_uri == "index.md":  # the README, its links made relative to docs/
        markdown = (ROOT / "README.md").read_text(encoding="utf-8")
        markdown = markdown.replace("](docs/", "](").replace("](CHANGELOG.md)", "](changelog.md)")
        markdown = markdown.replace("([LICENSE](LICENSE))", "(`LICENSE`)")

    def generate(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in GENERATORS:
            raise ValueError(f"<!-- generated: {name} -->: no such table ({sorted(GENERATORS)})")
        return GENERATORS[name]()

    return MARKER.sub(generate, markdown)
