"""Rules a kernel's source must keep before it runs at all (docs/method.md §5c, the allow-list), read from
its syntax tree on the host; every broken rule is listed, the first is the candidate's reason for reward 0.

An allow-list, not a deny-list: a kernel may import only torch, torch.nn(.functional), triton,
triton.language, math and typing; may use of each module only the names allowed_names.py lists
(so `torch.os`, `torch.sys`, `typing.sys` and every other accidental re-export is refused without
being named); may name a module only at the start of an attribute chain (never pass `torch` around
as a value, where a rule could not follow it); may call only the listed builtins (no getattr,
setattr, eval, exec, compile, open, __import__, globals, vars, locals, dir, breakpoint); may use
no name or attribute starting with "_" (dunders, privates); may not subclass torch.Tensor, define
__torch_function__ or other special methods, or assign attributes of library objects (only the
backend precision flags); may call torch.compile only where it is named, with plain settings (no
`options=`, no callable backend). Each refusal names the construct and its line.

These rules are the second line. The first is the clock (driver.py): the candidate runs in a
process of its own, timed from a process it cannot reach, and its output is judged elsewhere, so
what slips past the rules can still only spend its own time.
"""

from __future__ import annotations

import ast
import threading

from evaluators.kernels.trimul.allowed_names import (
    ASSIGNABLE_MODULES,
    BUILTINS,
    DANGEROUS_BUILTINS,
    DUNDER_DEFINITIONS,
    IMPORTABLE,
    MODULE_NAMES,
    OBJECT_ATTRIBUTES_REFUSED,
)

TENSOR_BASES = frozenset({"Tensor", "Parameter"})
# torch.compile's keywords a kernel may pass, and the literal values of those that take a name.
COMPILE_KEYWORDS = frozenset({"fullgraph", "dynamic", "backend", "mode", "disable"})
COMPILE_CHOICES = {
    "backend": frozenset({"inductor", "eager", "aot_eager"}),
    "mode": frozenset({"default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"}),
}
# One parse at a time: CPython 3.11's ast module keeps its recursion depth in shared state, and two
# threads parsing at once corrupt it for every later parse ("AST constructor recursion depth mismatch").
_PARSE_LOCK = threading.Lock()
ENTRY_POINT = "custom_kernel"


def dotted(node: ast.AST) -> str:
    """`a.b.c` for a chain of attributes on a name, else ""."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return ""


def bound_names(tree: ast.Module) -> set[str]:
    """Every name the module binds anywhere (assignments, definitions, arguments, imports, handlers)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            names.update(node.names)
    return names


class _Rules(ast.NodeVisitor):
    def __init__(self, tree: ast.Module) -> None:
        self.problems: list[str] = []
        self.aliases: dict[str, str] = {}  # local name -> module path or module name ("tl" -> "triton.language")
        self.jit_kernels: list[str] = []
        self.has_entry = False
        self.own = bound_names(tree)
        self.top_level = set(tree.body)
        self.chain_heads: set[int] = set()  # ids of Name nodes that start an attribute chain

    def fail(self, node: ast.AST, message: str) -> None:
        self.problems.append(f"line {getattr(node, 'lineno', '?')}: {message}")

    def resolve(self, node: ast.AST) -> str:
        name = dotted(node)
        head, _, rest = name.partition(".")
        return (self.aliases.get(head, head) + ("." + rest if rest else "")) if name else ""

    def module_of(self, name: str) -> str:
        """The module path a local name stands for ("" when it is none)."""
        path = self.aliases.get(name, "")
        return path if path in MODULE_NAMES else ""

    # -- imports -------------------------------------------------------------------------------

    def judge_import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name not in IMPORTABLE:
                self.fail(node, f"imports {alias.name!r}; a kernel may import only {self._importable()}")
                continue
            local = alias.asname or alias.name.split(".")[0]
            self.aliases[local] = alias.name if alias.asname else alias.name.split(".")[0]

    def judge_import_from(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        if node.level:
            self.fail(node, "relative imports are not allowed (a kernel is one module)")
            return
        if module not in IMPORTABLE:
            self.fail(node, f"imports {module!r}; a kernel may import only {self._importable()}")
            return
        for alias in node.names:
            if module == "__future__":
                continue
            allowed = MODULE_NAMES.get(module, frozenset())
            if alias.name not in allowed:
                self.fail(node, f"`from {module} import {alias.name}`: `{alias.name}` is not among the {module} names a kernel may use")
                continue
            self.aliases[alias.asname or alias.name] = f"{module}.{alias.name}"

    @staticmethod
    def _importable() -> str:
        return ", ".join(sorted(IMPORTABLE - {"__future__"}))

    # -- names and attribute chains --------------------------------------------------------------

    def visit_Name(self, node: ast.Name) -> None:
        name = node.id
        if name in DANGEROUS_BUILTINS:
            self.fail(node, f"uses `{name}`, which {DANGEROUS_BUILTINS[name]}; it is not allowed")
        elif name.startswith("__") and name not in BUILTINS:
            self.fail(node, f"uses `{name}`: names starting with '__' reach the interpreter's internals")
        elif isinstance(node.ctx, ast.Load) and self.module_of(name) and id(node) not in self.chain_heads:
            self.fail(
                node,
                f"uses the module `{name}` ({self.module_of(name)}) as a value; a module may only be "
                "named as the start of an attribute chain such as `torch.einsum`",
            )
        elif isinstance(node.ctx, ast.Load) and name not in self.own and name not in self.aliases and name not in BUILTINS:
            self.fail(node, f"uses `{name}`, which the kernel never defines and is not one of the builtins a kernel may use")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        chain = dotted(node)
        head = chain.partition(".")[0] if chain else ""
        if chain and self.module_of(head) and isinstance(node.value, (ast.Name, ast.Attribute)):
            self._check_chain(node)
            return  # the whole chain is judged at once
        if node.attr.startswith("_"):
            self.fail(node, f"uses `.{node.attr}`: attributes starting with '_' (dunders, private state) are not allowed")
        elif node.attr in OBJECT_ATTRIBUTES_REFUSED:
            self.fail(node, f"uses `.{node.attr}`, which reaches {OBJECT_ATTRIBUTES_REFUSED[node.attr]}; it is not allowed")
        self.generic_visit(node)

    def _check_chain(self, node: ast.Attribute) -> None:  # docs/method.md §5c, the allow-list: module chains
        """`torch.nn.functional.linear`: every link must be on the list of the module before it, and a
        chain that ends on a namespace is only allowed as the start of a longer one (its parent)."""
        links: list[ast.Attribute] = []
        cursor: ast.AST = node
        while isinstance(cursor, ast.Attribute):
            links.append(cursor)
            cursor = cursor.value
        self.chain_heads.add(id(cursor))
        self.visit(cursor)
        path = self.module_of(cursor.id)
        for link in reversed(links):
            allowed = MODULE_NAMES.get(path)
            if allowed is None:  # a leaf (a function, a dtype, a class): its attributes are the object's
                if link.attr.startswith("_"):
                    self.fail(link, f"uses `.{link.attr}` of `{path}`: attributes starting with '_' are not allowed")
                    return
                if link.attr in OBJECT_ATTRIBUTES_REFUSED:
                    self.fail(link, f"uses `.{link.attr}`, which reaches {OBJECT_ATTRIBUTES_REFUSED[link.attr]}; it is not allowed")
                    return
                path = f"{path}.{link.attr}"
                continue
            if link.attr not in allowed:
                module = path
                self.fail(
                    link,
                    f"uses `{module}.{link.attr}`: `.{link.attr}` is not among the {module} names a kernel may "
                    "use (tensor programming only: no files, processes, threads, streams, timers or internals)",
                )
                return
            path = f"{path}.{link.attr}"
        if path in MODULE_NAMES:  # the outermost link of a chain is a value: a namespace may not be one
            self.fail(node, f"uses the module `{path}` as a value; name what it holds instead (e.g. `{path}.<name>`)")

    def _check_compile(self, node: ast.Call) -> None:
        """torch.compile with plain settings only: `options` can name a C++ compiler command, a debug
        directory anywhere or Inductor internals, and a callable `backend` is handed the traced graph."""
        if len(node.args) > 1 or any(isinstance(a, ast.Starred) for a in node.args):
            self.fail(node, "calls torch.compile with more than the function positionally; pass settings by keyword")
        for kw in node.keywords:
            if kw.arg not in COMPILE_KEYWORDS:
                what = "**" if kw.arg is None else f"`{kw.arg}=`"
                self.fail(node, f"calls torch.compile with {what}; only {', '.join(sorted(COMPILE_KEYWORDS))} are allowed")
            elif kw.arg in COMPILE_CHOICES:
                choices = COMPILE_CHOICES[kw.arg]
                if not (isinstance(kw.value, ast.Constant) and kw.value.value in choices):
                    self.fail(node, f"calls torch.compile with {kw.arg}= other than one of {', '.join(sorted(choices))} (a string literal)")

    def visit_Call(self, node: ast.Call) -> None:
        if self.resolve(node.func) == "torch.compile":
            self._check_compile(node)
        if isinstance(node.func, ast.Name) and node.func.id == "type" and len(node.args) == 3:
            self.fail(node, "creating classes with type(name, bases, dict) is not allowed")
        if (
            isinstance(node.func, ast.Attribute)
            and node.func.attr == "__init__"
            and isinstance(node.func.value, ast.Call)
            and isinstance(node.func.value.func, ast.Name)
            and node.func.value.func.id == "super"
        ):
            self.visit(node.func.value)  # super().__init__(...): the one dunder call a module class needs
            for arg in [*node.args, *node.keywords]:
                self.visit(arg)
            return
        self.generic_visit(node)

    def visit_Match(self, node: ast.AST) -> None:
        self.fail(node, "`match` statements are not allowed (class patterns read attributes by name)")

    # -- assignments: no patching --------------------------------------------------------------

    def _check_target(self, target: ast.AST, verb: str) -> None:
        if isinstance(target, (ast.Tuple, ast.List)):
            for t in target.elts:
                self._check_target(t, verb)
        elif isinstance(target, ast.Starred):
            self._check_target(target.value, verb)
        elif isinstance(target, ast.Attribute):
            full = self.resolve(target)
            root = dotted(target).split(".")[0]
            if root in ("self", "cls") and not target.attr.startswith("_"):
                return
            if verb == "assigns to" and full.rpartition(".")[0] in ASSIGNABLE_MODULES:
                return
            self.fail(
                target,
                f"{verb} `{full or dotted(target) or 'an attribute'}`: changing attributes of modules or "
                f"library objects is not allowed (only the flags of {', '.join(sorted(ASSIGNABLE_MODULES))})",
            )
        elif isinstance(target, ast.Subscript):
            base = self.resolve(target.value)
            if base and self.module_of(base.split(".")[0]):
                self.fail(target, f"{verb} an item of `{base}`, a library object")

    def visit_Assign(self, node: ast.Assign) -> None:
        for t in node.targets:
            self._check_target(t, "assigns to")
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._check_target(node.target, "assigns to")
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self._check_target(node.target, "assigns to")
        self.generic_visit(node)

    def visit_Delete(self, node: ast.Delete) -> None:
        for t in node.targets:
            if isinstance(t, (ast.Attribute, ast.Subscript)):
                self._check_target(t, "deletes")
        self.generic_visit(node)

    # -- definitions ---------------------------------------------------------------------------

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for base in node.bases:
            name = self.resolve(base)
            if name.split(".")[-1] in TENSOR_BASES:
                self.fail(node, f"class {node.name} subclasses {name}: tensor subclasses are not allowed")
        for kw in node.keywords:
            self.fail(node, f"class {node.name} passes `{kw.arg}=` to its metaclass machinery; it is not allowed")
        self.generic_visit(node)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        if node.name.startswith("__") and node.name.endswith("__") and node.name not in DUNDER_DEFINITIONS:
            self.fail(
                node,
                f"defines `{node.name}`: special methods other than {', '.join(sorted(DUNDER_DEFINITIONS))} "
                "(e.g. __torch_function__, __torch_dispatch__) are not allowed",
            )
        if node.name in DANGEROUS_BUILTINS:
            self.fail(node, f"defines a function named `{node.name}`, a name kept for a builtin that is not allowed")
        for d in node.decorator_list:
            name = self.resolve(d.func if isinstance(d, ast.Call) else d)
            if name in ("triton.jit", "triton.language.jit") or name.startswith("triton.jit"):
                self.jit_kernels.append(node.name)
        if node.name == ENTRY_POINT and node in self.top_level:
            self.has_entry = True
        self.generic_visit(node)

    visit_AsyncFunctionDef = visit_FunctionDef

    def run(self, tree: ast.Module) -> None:
        for node in tree.body:  # `custom_kernel = torch.compile(fn)` defines the entry point too
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == ENTRY_POINT for t in node.targets):
                self.has_entry = True
        # Imports first, wherever they are, so that every use of an alias is judged as a module use.
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                self.judge_import(node)
            elif isinstance(node, ast.ImportFrom):
                self.judge_import_from(node)
        self._judge_compile_uses(tree)
        self.visit(tree)

    def _judge_compile_uses(self, tree: ast.Module) -> None:
        """torch.compile only called (judged by _check_compile) or a bare decorator: never a value
        (`c = torch.compile; c(f, options=...)` would pass settings no rule reads)."""
        sanctioned = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
        for n in ast.walk(tree):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                sanctioned.update(id(d) for d in n.decorator_list)
        for n in ast.walk(tree):
            if isinstance(n, (ast.Name, ast.Attribute)) and id(n) not in sanctioned and self.resolve(n) == "torch.compile":
                self.fail(n, "uses torch.compile as a value; call it (or use it as a decorator) where it is named")


def _line(problem: str) -> int:
    number = problem.split(":")[0].removeprefix("line ")
    return int(number) if number.isdigit() else 0


def check_source(source: str) -> list[str]:
    """Every broken rule of the kernel `source`, in source order; empty when it may run."""
    try:
        with _PARSE_LOCK:
            tree = ast.parse(source)
        rules = _Rules(tree)
        rules.run(tree)
    except SyntaxError as err:
        return [f"syntax error: {err.msg} (line {err.lineno})"]
    except ValueError as err:  # null bytes
        return [f"cannot parse the kernel: {err}"]
    except (RecursionError, MemoryError):  # CPython's parser stack and the checker's walk are bounded: so is the source's nesting
        return ["the kernel is nested too deeply to check (an expression or statement nested hundreds of levels)"]
    problems = sorted(dict.fromkeys(rules.problems), key=_line)
    if not rules.has_entry:
        problems.append(f"defines no top-level function `{ENTRY_POINT}(data)`")
    if not rules.jit_kernels:
        problems.append("defines no @triton.jit kernel: at least part of the work must be written in Triton")
    return problems
