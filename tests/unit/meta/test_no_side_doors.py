"""The parts of a run find each other through explicit arguments, never through side doors
(docs/architecture.md §7, "The Run"): no module-level registry of live objects, and no callback attribute of
another object reassigned at run time. Both are found by reading the source (ast), so a new side door fails here."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.unit.meta.source_tree import ROOT, parsed, source_files

WEAK = ("WeakKeyDictionary", "WeakValueDictionary", "WeakSet")
CONTAINERS = ("dict", "set", "list", "defaultdict", "OrderedDict", *WEAK)
MUTATORS = ("add", "update", "setdefault", "pop", "popitem", "append", "extend", "insert", "remove", "discard",
            "clear", "__setitem__")
# module-level state that belongs to the process, not to a run (what one run composes never goes here)
PROCESS_STATE = {
    "orchestration/commands.py": {"ACTIONS", "TOOLS"},  # handler functions, filled by decorators at import
    "supervision/spawn.py": {"_subreaper_users", "_LIFELINES"},  # the process's subreaper flag and its fds
    "supervision/zygote.py": {"_ROOT_PIDFD"},  # the fork server's own pidfd of its root
    "bus/protocol.py": {"_registry"},  # message types and their fields, registered at import
    "bus/security.py": {"_auth_by_ctx"},  # one ZAP authenticator per zmq context (process-wide in libzmq)
    "procs/cgroup.py": {"_run_seq"},  # a counter
    "ledger/pg_engine.py": {"_engines"},  # the process's connection pools, one per PostgreSQL URL
    "ledger/mail.py": {"_ADDRESSED"},  # per database: the nodes its mail went to (strings; a reader and a writer share it)
    "procs/lineage.py": {"_scan"},  # the process's last scan of the process table (one per retire round)
    "workers/providers/pricing.py": {"_RATES", "_MODELS"},  # price table caches
    "agents/schema.py": {"_COMPILED"},  # the field tables' compiled validators
    "workers/tools/schema.py": {"_COMPILED"},  # the tool schemas' compiled validators
    "agents/prompt.py": {"_found_in"},  # folders' instruction-file lookups, checked against the folders' mtimes
    "workers/providers/scripted.py": {"_registry", "_file_cache"},  # scripted models by name, parsed files
    "workers/providers/thinking.py": {"_warned"},  # warnings said once per process
    "workers/runtime.py": {"_preconfigured", "_log_threshold"},  # the process's logging set-up
}


def _parsed() -> tuple[tuple[Path, ast.Module], ...]:
    """Every source file and its syntax tree."""
    return tuple((path, parsed(path)) for path in source_files())


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _module_containers(tree: ast.Module) -> dict[str, int]:
    found: dict[str, int] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name, value = node.targets[0].id, node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            name, value = node.target.id, node.value
        else:
            continue
        called = ast.unparse(value.func).rsplit(".", 1)[-1] if isinstance(value, ast.Call) else ""
        if isinstance(value, ast.Dict | ast.Set | ast.List) or called in CONTAINERS:
            found[name] = node.lineno
    return found


def _mutated_in_functions(tree: ast.Module, names: dict[str, int]) -> set[str]:
    mutated: set[str] = set()
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(fn):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                node, ast.AugAssign | ast.AnnAssign) else []
            for target in targets:
                if isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name) and target.value.id in names:
                    mutated.add(target.value.id)
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS
                    and isinstance(node.func.value, ast.Name) and node.func.value.id in names):
                mutated.add(node.func.value.id)
    return mutated


def test_no_module_level_registry_of_live_objects() -> None:
    bad = []
    for path, tree in _parsed():
        containers = _module_containers(tree)
        for node in tree.body:  # a weak registry is one whatever it holds
            value = node.value if isinstance(node, ast.Assign | ast.AnnAssign) else None
            if isinstance(value, ast.Call) and ast.unparse(value.func).rsplit(".", 1)[-1] in WEAK:
                bad.append(f"{_rel(path)}:{node.lineno}: module-level {ast.unparse(value.func)}")
        allowed = PROCESS_STATE.get(_rel(path), set())
        for name in sorted(_mutated_in_functions(tree, containers) - allowed):
            bad.append(f"{_rel(path)}:{containers[name]}: module-level {name} is filled at run time")
    assert not bad, ("module-level registries of live objects (pass the object to whoever needs it, as the Run "
                     "does):\n" + "\n".join(bad))


def _function_names(trees: list[ast.Module], *, methods: bool = True) -> set[str]:
    """Functions and methods (properties are data, not callbacks); without `methods`, plain functions only."""
    names: set[str] = set()
    for tree in trees:
        for node in ast.walk(tree):
            body = node.body if isinstance(node, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) else []
            if isinstance(node, ast.ClassDef) and not methods:
                continue
            for fn in body:
                if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef) and not any(
                        ast.unparse(d).endswith(("property", "setter")) for d in fn.decorator_list):
                    names.add(fn.name)
    return names


def test_no_callback_attribute_of_another_object_is_reassigned() -> None:
    """`other.hook = fn`, `other.hook = self.method`, `other.hook = lambda …`: a side door; the owner offers a
    method to register with (`serve_tools`, `subscribe_sessions`, `attach`) or takes it when it is made."""
    parsed = _parsed()
    functions = _function_names([tree for _, tree in parsed])
    bad = []
    for path, tree in parsed:
        local = _function_names([tree], methods=False)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Assign):
                continue
            value = node.value
            for target in node.targets:
                if not isinstance(target, ast.Attribute):
                    continue
                callable_value = (isinstance(value, ast.Lambda)  # `other.hook = lambda …`
                                  or (isinstance(value, ast.Name) and value.id in local)  # a function of this file
                                  or (isinstance(value, ast.Attribute) and value.attr in functions  # a bound method:
                                      and ((isinstance(value.value, ast.Name) and value.value.id == "self")
                                           or value.attr == target.attr)))  # its own, or one of the same name
                if not callable_value:
                    continue
                base = target.value
                if isinstance(base, ast.Name) and base.id in ("self", "cls"):
                    continue  # an object setting its own attribute
                bad.append(f"{_rel(path)}:{node.lineno}: {ast.unparse(node)}")
    assert not bad, "callback attributes of other objects assigned at run time:\n" + "\n".join(bad)


def test_the_checks_find_what_they_look_for(tmp_path: Path) -> None:
    """The two readers above do find a weak registry, a filled module dict and a reassigned callback."""
    tree = ast.parse("import weakref\n_R = weakref.WeakKeyDictionary()\n_D: dict = {}\n"
                     "def put(k, v):\n    _D[k] = v\n"
                     "def wire(root, orch):\n    root.session_event = orch.on_event\n")
    containers = _module_containers(tree)
    assert set(containers) == {"_R", "_D"}
    assert _mutated_in_functions(tree, containers) == {"_D"}
    assign = [n for n in ast.walk(tree) if isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Attribute)]
    assert assign and isinstance(assign[0].value, ast.Attribute) and assign[0].value.attr == "on_event"
