"""The installed names are saga_shared and saga_services (links to the repository's shared/ and
services/), so that a user's own ``shared`` or ``services`` package never clashes with ours. An
import by a directory's name would load a second copy of the module under another name, its
classes distinct from the first's: none may exist, in the code, the templates or the docs."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OLD = re.compile(r"^\s*(from|import) (shared|services)(\.|\s|$)", re.M)


def test_the_links_give_the_installed_names() -> None:
    for name, directory in (("saga_shared", "shared"), ("saga_services", "services")):
        link = ROOT / name
        assert link.is_symlink() and link.readlink() == Path(directory)


def test_nothing_imports_a_package_by_its_directorys_name() -> None:
    tracked = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    sources = [
        ROOT / f for f in tracked
        if f.endswith((".py", ".tmpl", ".md")) and not (ROOT / f).is_symlink()
    ]  # fmt: skip
    assert len(sources) > 200
    found = [
        f"{path.relative_to(ROOT)}: {match.group(0).strip()}"
        for path in sources
        for match in OLD.finditer(path.read_text(encoding="utf-8"))
    ]
    assert found == []
