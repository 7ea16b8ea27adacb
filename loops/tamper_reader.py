"""The AST reader of `loops.tamper`: resolve the names a file uses and find where it tampers with the test machinery.

`read_hits(tree, program)` walks one parsed file and returns the (line, what) of every line that
leaves the test process early, patches the runner or the assertions, stops pytest, or replaces the
runner's modules. Aliases are resolved first (`import os as o`, `from os import _exit`,
`__import__('os')._exit`, `getattr(os, '_exit')`, `sys.modules['os']._exit`,
`T = unittest.TestCase`), and an `exec` of a literal is read too, up to `MAX_EXEC_DEPTH`. Pure.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable

# Hits kept per version of a file before old and new are compared: generous, so that many old
# findings cannot crowd a new one out.
MAX_HITS_PER_FILE = 50_000
MAX_NAME_CHARS = 200  # of a resolved dotted name
MAX_DEPTH = 100  # nested expressions followed when resolving a name
MAX_EXEC_DEPTH = 2  # exec('...') of a literal is read, and an exec inside that, no deeper


def read_hits(tree: ast.Module, program: bool) -> list[tuple[int, str]]:
    """Return the (line, what) of every tampering line in `tree`; `program`: it runs as a program, not imported."""
    visitor = _Visitor(_aliases(tree))
    visitor.importing = not program
    return visitor.run(tree)


# --- Names ----------------------------------------------------------------------------------------

# Whose attributes the runner's work depends on: patching them is tampering.
WATCHED_ROOTS = frozenset({"unittest", "pytest", "_pytest", "pluggy", "iniconfig", "builtins", "atexit", "doctest"})
# Attributes of `sys` that decide what is imported or how the process ends.
WATCHED_SYS = frozenset({"modules", "meta_path", "path_hooks", "path_importer_cache", "exit", "excepthook"})
# Modules whose import in non-test code is itself unusual (pytest's and pluggy's internals).
INTERNAL_ROOTS = frozenset({"_pytest", "pluggy"})

EXEC_NAMES = ("execl", "execle", "execlp", "execlpe", "execv", "execve", "execvp", "execvpe")
# Leave the process at once, whatever the tests said: flagged wherever they are.
HARD_EXITS = frozenset(
    {"os._exit", "posix._exit", "nt._exit"} | {f"os.{name}" for name in EXEC_NAMES} | {f"posix.{name}" for name in EXEC_NAMES}
)
# End the process by raising SystemExit: ordinary in a function or a __main__ block, tampering at import.
SOFT_EXITS = frozenset({"sys.exit", "exit", "quit", "builtins.exit", "builtins.quit"})
SYSTEM_EXIT = frozenset({"SystemExit", "builtins.SystemExit"})
SKIP_TEST = frozenset({"unittest.SkipTest", "unittest.case.SkipTest"})
PYTEST_EXIT = frozenset({"pytest.exit", "_pytest.outcomes.exit"})
PYTEST_SKIPS = frozenset(
    {"pytest.skip", "pytest.xfail", "pytest.importorskip", "_pytest.outcomes.skip", "_pytest.outcomes.xfail"}
)
SETATTRS = frozenset({"setattr", "builtins.setattr", "object.__setattr__", "type.__setattr__"})
DELATTRS = frozenset({"delattr", "builtins.delattr", "object.__delattr__", "type.__delattr__"})
IMPORTERS = frozenset({"__import__", "builtins.__import__", "importlib.__import__"})
IMPORT_MODULE = frozenset({"importlib.import_module"})
GETATTRS = frozenset({"getattr", "builtins.getattr"})
VARS = frozenset({"vars", "builtins.vars"})
EXECS = frozenset({"exec", "eval", "builtins.exec", "builtins.eval"})
DICT_WRITES = frozenset({"update", "setdefault", "pop", "popitem", "clear", "__setitem__", "__delitem__", "__ior__"})
LIST_WRITES = frozenset({"insert", "append", "extend", "remove", "pop", "clear", "__setitem__", "__delitem__", "__iadd__"})
IMPORT_HOOKS = frozenset({"sys.meta_path", "sys.path_hooks"})
MOCK_PATCHES = {
    "unittest.mock.patch": "",
    "unittest.mock.patch.object": "object",
    "unittest.mock.patch.dict": "dict",
    "unittest.mock.patch.multiple": "object",
}


def _watched(name: str | None) -> bool:
    if not name:
        return False
    root, _, rest = name.partition(".")
    return root in WATCHED_ROOTS or (root == "sys" and rest.split(".")[0] in WATCHED_SYS)


def _const_str(node: ast.AST | None, depth: int = 0) -> str | None:
    """A string the expression always is: a literal, literals joined by `+`, or an f-string of literals."""
    if node is None or depth > MAX_DEPTH:
        return None
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value[:MAX_NAME_CHARS]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _const_str(node.left, depth + 1), _const_str(node.right, depth + 1)
        return None if left is None or right is None else (left + right)[:MAX_NAME_CHARS]
    if isinstance(node, ast.JoinedStr):
        parts = [_const_str(value, depth + 1) for value in node.values]
        return None if any(part is None for part in parts) else "".join(p or "" for p in parts)[:MAX_NAME_CHARS]
    return None


def _module_name(name: str) -> str:
    """`mock.x` (the mock package) reads as `unittest.mock.x`."""
    if name == "mock" or name.startswith("mock."):
        return "unittest." + name
    return name


class _Names:
    """What local names stand for: imports, star imports, and simple `name = <dotted thing>` assignments."""

    def __init__(self) -> None:
        self.aliases: dict[str, str] = {"__builtins__": "builtins"}
        self.stars: list[str] = []
        # Names the file binds to something else (a function, a class, a parameter, a value):
        # they stand for nothing watched. A name neither imported nor bound stands for itself.
        self.local: set[str] = set()

    def resolve(self, node: ast.AST | None, depth: int = 0) -> str | None:
        """The dotted name an expression stands for (`o._exit` → `os._exit`), or None."""
        if node is None or depth > MAX_DEPTH:
            return None
        name = self._resolve(node, depth)
        return name if name is None or len(name) <= MAX_NAME_CHARS else None

    def _resolve(self, node: ast.AST, depth: int) -> str | None:
        if isinstance(node, ast.Name):
            if node.id in self.aliases:
                return self.aliases[node.id]
            if node.id in self.local:
                return None
            for module in self.stars:
                if f"{module}.{node.id}" in HARD_EXITS or f"{module}.{node.id}" in SOFT_EXITS:
                    return f"{module}.{node.id}"
            return node.id
        if isinstance(node, ast.Attribute):
            base = self.resolve(node.value, depth + 1)
            return None if base is None else f"{base}.{node.attr}"
        if isinstance(node, ast.Subscript):
            base = self.resolve(node.value, depth + 1)
            key = _const_str(node.slice)
            if base is None or key is None:
                return None
            if base == "sys.modules":
                return _module_name(key)
            if base.endswith(".__dict__"):
                return f"{base.removesuffix('.__dict__')}.{key}"
            if base == "builtins":  # __builtins__ is a dict outside __main__
                return f"builtins.{key}"
            return None
        if isinstance(node, ast.Call):
            func = self.resolve(node.func, depth + 1)
            args = node.args
            if func in IMPORTERS and args:
                imported = _const_str(args[0])
                if imported is None:
                    return None
                fromlist = args[3] if len(args) > 3 else _keyword(node, "fromlist")
                whole = fromlist is not None and not (isinstance(fromlist, ast.Constant) and not fromlist.value)
                return _module_name(imported if whole else imported.split(".")[0])
            if func in IMPORT_MODULE and args:
                imported = _const_str(args[0])
                return None if imported is None or imported.startswith(".") else _module_name(imported)
            if func in GETATTRS and len(args) >= 2:
                base, attr = self.resolve(args[0], depth + 1), _const_str(args[1])
                return None if base is None or attr is None else f"{base}.{attr}"
            if func in VARS and len(args) == 1:
                base = self.resolve(args[0], depth + 1)
                return None if base is None else f"{base}.__dict__"
        return None


def _keyword(call: ast.Call, name: str) -> ast.expr | None:
    for keyword in call.keywords:
        if keyword.arg == name:
            return keyword.value
    return None


def _aliases(tree: ast.Module, outer: _Names | None = None) -> _Names:
    names = _Names()
    if outer is not None:  # code given to exec sees the names of the code around it
        names.aliases.update(outer.aliases)
        names.stars.extend(outer.stars)
    nodes = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom | ast.Assign | ast.AnnAssign | ast.NamedExpr):
            nodes.append(node)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.local.add(node.name)
        elif isinstance(node, ast.arg):
            names.local.add(node.arg)
    nodes.sort(key=lambda node: (getattr(node, "lineno", 0), getattr(node, "col_offset", 0)))
    for node in nodes:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    names.aliases[alias.asname] = _module_name(alias.name)
                else:
                    top = alias.name.split(".")[0]
                    names.aliases[top] = _module_name(top)
        elif isinstance(node, ast.ImportFrom):
            module = _module_name(("." * node.level) + (node.module or ""))
            for alias in node.names:
                if alias.name == "*":
                    names.stars.append(module)
                else:
                    names.aliases[alias.asname or alias.name] = _module_name(f"{module}.{alias.name}")
        else:
            value = node.value
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if value is None:
                continue
            resolved = names.resolve(value)
            for target in targets:
                if not isinstance(target, ast.Name) or target.id == resolved:
                    continue
                if resolved is None:
                    names.local.add(target.id)
                else:
                    names.aliases[target.id] = resolved
    return names


# --- The reader -----------------------------------------------------------------------------------


def _is_main_guard(test: ast.expr) -> bool | None:
    """True for `__name__ == "__main__"`, False for `!=`, None for anything else."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and len(test.comparators) == 1):
        return None
    sides = [test.left, test.comparators[0]]
    has_name = any(isinstance(side, ast.Name) and side.id == "__name__" for side in sides)
    has_main = any(isinstance(side, ast.Constant) and side.value == "__main__" for side in sides)
    if not (has_name and has_main):
        return None
    if isinstance(test.ops[0], ast.Eq):
        return True
    if isinstance(test.ops[0], ast.NotEq):
        return False
    return None


def _may_exit_zero(args: list[ast.expr]) -> bool:
    """Whether `sys.exit(*args)` may end the process with status 0 (a literal 1 or message cannot)."""
    if not args:
        return True
    first = args[0]
    if isinstance(first, ast.UnaryOp) and isinstance(first.op, ast.USub) and isinstance(first.operand, ast.Constant):
        value = first.operand.value
        return not (isinstance(value, int) and not isinstance(value, bool) and value % 256 != 0)
    if isinstance(first, ast.Constant):
        value = first.value
        if isinstance(value, str):
            return False
        if isinstance(value, int) and not isinstance(value, bool):
            return value % 256 == 0
        return value in (None, False)
    return True


class _Visitor(ast.NodeVisitor):
    def __init__(self, names: _Names, exec_depth: int = 0) -> None:
        self.names = names
        self.exec_depth = exec_depth
        self.hits: list[tuple[int, str]] = []
        self.importing = True  # code that runs while the module is imported
        self.handled: set[int] = set()  # nodes already reported as part of a larger one
        self.line_offset = 0

    def run(self, tree: ast.AST) -> list[tuple[int, str]]:
        self.visit(tree)
        return self.hits

    def hit(self, node: ast.AST, what: str) -> None:
        if len(self.hits) < MAX_HITS_PER_FILE:
            self.hits.append((self.line_offset or getattr(node, "lineno", 0), what))

    # Where code runs.

    def _in_function(self, body: Iterable[ast.AST]) -> None:
        importing, self.importing = self.importing, False
        for node in body:
            self.visit(node)
        self.importing = importing

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        # Decorators, defaults and annotations run at definition; the body when called.
        for child in [*node.decorator_list, node.args, *([node.returns] if node.returns else [])]:
            self.visit(child)
        for param in getattr(node, "type_params", []):
            self.visit(param)
        self._in_function(node.body)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node: ast.Lambda) -> None:
        self.visit(node.args)
        self._in_function([node.body])

    def visit_If(self, node: ast.If) -> None:
        guard = _is_main_guard(node.test)
        if guard is None:
            self.generic_visit(node)
            return
        self.visit(node.test)
        main, other = (node.body, node.orelse) if guard else (node.orelse, node.body)
        self._in_function(main)  # runs as a program, never at import
        for child in other:
            self.visit(child)

    # Imports.

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name.split(".")[0] in INTERNAL_ROOTS:
                self.hit(node, f"imports {alias.name}")

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = _module_name(node.module or "") if node.level == 0 else ""
        if module.split(".")[0] in INTERNAL_ROOTS:
            self.hit(node, f"imports from {module}")
            return
        for alias in node.names:
            name = f"{module}.{alias.name}"
            if name in HARD_EXITS or name.startswith("atexit.") or name in PYTEST_EXIT:
                self.hit(node, f"imports {name}")

    # Calls and references.

    def visit_Call(self, node: ast.Call) -> None:
        if id(node) not in self.handled:
            self._reference(node)
        func = self.names.resolve(node.func)
        if func is not None:
            self._call(node, func)
        self.generic_visit(node)

    def _call(self, node: ast.Call, func: str) -> None:
        handled = True
        if func in HARD_EXITS:
            self.hit(node, f"calls {func}")
        elif func in SOFT_EXITS:
            if self.importing and _may_exit_zero(node.args):
                self.hit(node, f"calls {func} at import")
        elif func.startswith("atexit."):
            self.hit(node, f"uses {func}")
        elif func in PYTEST_EXIT:
            self.hit(node, f"calls {func}")
        elif func in PYTEST_SKIPS:
            self.hit(node, f"calls {func}{' at import' if self.importing else ''}")
        elif func in SETATTRS or func in DELATTRS:
            self._setattr(node, func in DELATTRS)
        elif func in MOCK_PATCHES:
            self._mock_patch(node, MOCK_PATCHES[func])
        elif func in EXECS:
            self._exec(node, func)
        else:
            handled = self._mutation(node)
        if handled:
            self.handled.add(id(node.func))

    def _setattr(self, node: ast.Call, deleting: bool) -> None:
        if len(node.args) < 2:
            return
        target = self.names.resolve(node.args[0])
        if _watched(target):
            attr = _const_str(node.args[1]) or "<computed>"
            self.hit(node, f"{'deletes' if deleting else 'patches'} {target}.{attr}")
        elif target == "sys.modules.__dict__":
            self.hit(node, "writes sys.modules")

    def _mock_patch(self, node: ast.Call, kind: str) -> None:
        if not node.args:
            return
        first = node.args[0]
        if kind == "":
            target = _const_str(first)
            if target is not None and (_watched(target) or target in HARD_EXITS):
                self.hit(node, f"patches {target} (mock.patch)")
        elif kind == "object":
            target = self.names.resolve(first)
            attr = _const_str(node.args[1]) if len(node.args) > 1 else None
            if _watched(target):
                self.hit(node, f"patches {target}.{attr or '<computed>'} (mock.patch.object)")
        else:
            target = _const_str(first) or self.names.resolve(first)
            if target == "sys.modules":
                self.hit(node, "writes sys.modules (mock.patch.dict)")
            elif _watched(target):
                self.hit(node, f"patches {target} (mock.patch.dict)")

    def _exec(self, node: ast.Call, func: str) -> None:
        source = _const_str(node.args[0]) if node.args else None
        if source is None:
            if self.importing:
                self.hit(node, f"calls {func} at import on computed code")
            return
        if self.exec_depth >= MAX_EXEC_DEPTH:
            return
        try:
            tree = ast.parse(source, mode="exec")
        except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError):
            return
        inner = _Visitor(_aliases(tree, self.names), self.exec_depth + 1)
        inner.importing = self.importing
        inner.line_offset = self.line_offset or node.lineno
        for line, what in inner.run(tree):
            self.hits.append((line, f"{what} (in {func})"))

    def _mutation(self, node: ast.Call) -> bool:
        """`sys.modules.update(...)`, `builtins.__dict__.setdefault(...)`, `sys.meta_path.insert(...)`."""
        func = node.func
        if not isinstance(func, ast.Attribute):
            return False
        base = self.names.resolve(func.value)
        method = func.attr
        if base is None:
            return False
        if base == "sys.modules" and method in DICT_WRITES:
            key_node = node.args[0] if node.args and method != "update" else None
            if isinstance(key_node, ast.Name) and key_node.id == "__name__":
                return False
            key = _const_str(key_node)
            deleting = method in ("pop", "popitem", "clear", "__delitem__")
            verb = "deletes" if deleting else "writes"
            self.hit(node, f"{verb} sys.modules[{key!r}]" if key is not None else f"{verb} sys.modules ({method})")
            return True
        if method in DICT_WRITES and (base == "builtins" or (base.endswith(".__dict__") and _watched(base))):
            self.hit(node, f"patches {base.removesuffix('.__dict__')} ({method})")
            return True
        if base in IMPORT_HOOKS and method in LIST_WRITES:
            self.hit(node, f"modifies {base}")
            return True
        return False

    def _reference(self, node: ast.expr) -> None:
        name = self.names.resolve(node)
        if name is None:
            return
        if name in HARD_EXITS or name in PYTEST_EXIT:
            self.hit(node, f"refers to {name}")
        elif name.startswith("atexit.") and name != "atexit.__dict__":
            self.hit(node, f"uses {name}")  # @atexit.register, or handing it on

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Load) and id(node) not in self.handled:
            self._reference(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        self._visit_part(node, self._store_attribute)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        self._visit_part(node, self._store_subscript)

    def _visit_part[N: (ast.Attribute, ast.Subscript)](self, node: N, store: Callable[[N, bool], None]) -> None:
        """Judge `x.y` or `x[k]`: a write by `store`, a read as a reference; its `x` is judged as part of it."""
        if isinstance(node.ctx, ast.Store | ast.Del):
            store(node, isinstance(node.ctx, ast.Del))
        elif id(node) not in self.handled:
            self._reference(node)
        self.handled.add(id(node.value))
        self.generic_visit(node)

    def visit_Raise(self, node: ast.Raise) -> None:
        call = node.exc if isinstance(node.exc, ast.Call) else None
        exc = call.func if call is not None else node.exc
        name = self.names.resolve(exc) if exc is not None else None
        if name in SYSTEM_EXIT and self.importing and _may_exit_zero(call.args if call is not None else []):
            self.hit(node, "raises SystemExit at import")
        elif name in SKIP_TEST:
            self.hit(node, f"raises {name}{' at import' if self.importing else ''}")
        self.generic_visit(node)

    # Writes.

    def _store_attribute(self, node: ast.Attribute, deleting: bool) -> None:
        base = self.names.resolve(node.value)
        if base is None:
            return
        name = f"{base}.{node.attr}"
        verb = "deletes" if deleting else "patches"
        if name == "sys.modules":
            self.hit(node, f"{'deletes' if deleting else 'replaces'} sys.modules")
        elif _watched(name):
            self.hit(node, f"{verb} {name}")

    def _store_subscript(self, node: ast.Subscript, deleting: bool) -> None:
        base = self.names.resolve(node.value)
        if base is None:
            return
        verb = "deletes" if deleting else "writes"
        if base == "sys.modules":
            if isinstance(node.slice, ast.Name) and node.slice.id == "__name__":
                return
            key = _const_str(node.slice)
            self.hit(node, f"{verb} sys.modules[{key!r}]" if key is not None else f"{verb} sys.modules[...]")
        elif base == "builtins" or (base.endswith(".__dict__") and _watched(base)):
            key = _const_str(node.slice) or "<computed>"
            self.hit(node, f"{'deletes' if deleting else 'patches'} {base.removesuffix('.__dict__')}.{key}")
        elif base in IMPORT_HOOKS:
            self.hit(node, f"modifies {base}")
