"""The lazily exported packages (`legion.lazy_exports`): every listed name resolves from its submodule, an
unknown one is an AttributeError, and importing one submodule loads none of the others."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

PACKAGES = ("legion.bus", "legion.ledger", "legion.supervision", "legion.workers")


@pytest.mark.parametrize("package", PACKAGES)
def test_every_exported_name_resolves_from_its_submodule(package: str) -> None:
    pkg = importlib.import_module(package)
    assert sorted(pkg._EXPORTS) == sorted(pkg.__all__)
    for name, module in pkg._EXPORTS.items():
        assert getattr(pkg, name) is getattr(importlib.import_module(f"{package}.{module}"), name)
        assert name in vars(pkg)  # kept: the next lookup is a plain attribute


@pytest.mark.parametrize("package", PACKAGES)
def test_an_unknown_name_is_an_attribute_error_naming_the_package(package: str) -> None:
    pkg = importlib.import_module(package)
    with pytest.raises(AttributeError, match=rf"module '{package}' has no attribute 'nothing_here'"):
        pkg.nothing_here  # noqa: B018


def test_importing_one_submodule_loads_no_other() -> None:
    code = ("import sys, legion.workers.transcript, legion.supervision.child_spec; "
            "print(sorted(m for m in ('legion.workers.engine', 'legion.workers.session', 'legion.supervision.root', "
            "'legion.supervision.supervisor') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stdout


def test_the_event_names_load_no_zeromq() -> None:
    """The CLI's views read the bus's event names; `legion status` and the parser must not pay for ZeroMQ."""
    code = "import sys, legion.bus.protocol; print('zmq' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "False", out.stdout
