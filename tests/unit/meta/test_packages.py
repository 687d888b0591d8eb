"""pyproject.toml's package list matches the folders, so no subpackage is silently left out of the wheel."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
NOT_PACKAGES = {"tests", "bench"}  # top-level folders that are never part of the wheel


def _setuptools() -> dict[str, object]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    table: dict[str, object] = config["tool"]["setuptools"]
    return table


def _folders_with_init(top: Path) -> list[Path]:
    return sorted(p.parent for p in top.rglob("__init__.py") if ".venv" not in p.parts and "__pycache__" not in p.parts)


def test_every_package_folder_is_listed_and_mapped() -> None:
    table = _setuptools()
    listed = set(table["packages"])  # type: ignore[arg-type]
    package_dir: dict[str, str] = table["package-dir"]  # type: ignore[assignment]
    mapped = {ROOT / folder: name for name, folder in package_dir.items()}
    unmapped = [p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").exists()
                and p.name not in NOT_PACKAGES and p not in mapped]  # fmt: skip
    assert not unmapped, f"top-level packages missing from [tool.setuptools.package-dir]: {unmapped}"
    expected = set()
    for folder, name in mapped.items():
        for sub in _folders_with_init(folder):
            expected.add(".".join([name, *sub.relative_to(folder).parts]))
    assert not expected - listed, f"add to [tool.setuptools] packages: {sorted(expected - listed)}"


def test_nothing_listed_is_missing() -> None:
    table = _setuptools()
    package_dir: dict[str, str] = table["package-dir"]  # type: ignore[assignment]
    missing = []
    for name in table["packages"]:  # type: ignore[attr-defined]
        folder = package_dir.get(name)
        if folder is None:  # a subpackage of a mapped one: folder = parent's folder + last part
            parent, _, last = name.rpartition(".")
            folder = f"{package_dir.get(parent, parent.replace('.', '/'))}/{last}"
        if not (ROOT / folder / "__init__.py").exists():
            missing.append(f"{name} -> {folder}")
    assert not missing, f"listed in pyproject.toml but no package folder: {missing}"
    assert set(package_dir) <= set(table["packages"]), "every package-dir entry is also a listed package"  # type: ignore[arg-type]
