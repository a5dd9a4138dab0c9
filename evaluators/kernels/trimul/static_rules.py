"""Rules a kernel's source must keep before it runs at all (docs/method.md §5c, the reward hacks), read from
its syntax tree on the host; the first broken rule is the candidate's reason for reward 0.

The candidate shares its process with the driver that times it, so everything that process
reports could be forged by code that reaches the driver or the libraries it relies on. These rules
deny the means: introspection (frames, globals, `__dict__`, gc, sys, inspect), native code (ctypes,
C++ extensions, pickle), replacing library attributes (a clock, an event, a reference), tensor
subclasses and torch function or dispatch modes (lazy tensors), extra streams and threads. What
they allow is what a kernel needs: torch, triton, numpy and a few pure standard-library modules,
setting torch's backend and compiler flags, and attributes of its own objects. The driver checks
the same things again at run time (driver.py), and outputs are judged in another process.
"""

from __future__ import annotations

import ast

# Top-level modules a kernel may import.
ALLOWED_IMPORTS = frozenset(
    {"torch", "triton", "numpy", "math", "functools", "itertools", "collections", "operator", "typing",
     "dataclasses", "enum", "abc", "contextlib", "warnings", "__future__"}
)
# Attribute chains a kernel may assign to: flags of torch's backends and compilers.
ASSIGNABLE_PREFIXES = ("torch.backends.", "torch._dynamo.config.", "torch._inductor.config.", "torch._functorch.config.")
# Builtins that read or write what is not the kernel's own, or run code the rules never saw.
DENIED_NAMES = frozenset(
    {"eval", "exec", "compile", "__import__", "globals", "locals", "vars", "open", "setattr", "delattr",
     "breakpoint", "input", "__builtins__", "__loader__", "__spec__", "memoryview"}
)
# Attributes that reach interpreter internals, streams, timers, native code or tensor subclassing.
DENIED_ATTRIBUTES = frozenset(
    {
        # introspection and frames
        "__dict__", "__globals__", "__builtins__", "__code__", "__closure__", "__class__", "__bases__",
        "__mro__", "__subclasses__", "__getattribute__", "__setattr__", "__delattr__", "__self__",
        "__func__", "__wrapped__", "__defaults__", "__kwdefaults__", "__reduce__", "__reduce_ex__",
        "__init_subclass__", "__traceback__", "__loader__", "__spec__", "__import__", "tb_frame",
        "tb_next", "f_back", "f_globals", "f_locals", "f_builtins", "f_code", "gi_frame", "cr_frame",
        # lazy tensors: subclasses, torch function and dispatch modes
        "__torch_function__", "__torch_dispatch__", "_make_subclass", "_make_wrapper_subclass",
        "as_subclass", "TorchFunctionMode", "TorchDispatchMode", "overrides",
        # other streams, and the clock the driver uses
        "Stream", "ExternalStream", "stream", "set_stream", "StreamContext", "Event", "elapsed_time",
        "multiprocessing",
        # native code in the process, and code the rules never saw
        "_C", "cpp_extension", "load_inline", "load_library", "cudart", "ctypeslib", "attrgetter", "methodcaller",
    }
)
# Denied only on torch and numpy objects (`tl.load` is Triton's load, which every kernel uses):
# torch.load, torch.jit.load and numpy.load unpickle, i.e. run code the rules never saw.
DENIED_LIBRARY_ATTRIBUTES = frozenset({"load", "loads", "from_file"})
TENSOR_BASES = frozenset({"Tensor", "Parameter", "TorchFunctionMode", "TorchDispatchMode"})
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


class _Rules(ast.NodeVisitor):
    def __init__(self) -> None:
        self.problems: list[str] = []
        self.aliases: dict[str, str] = {}  # local name -> module path ("tl" -> "triton.language")
        self.jit_kernels: list[str] = []
        self.has_entry = False

    def fail(self, node: ast.AST, message: str) -> None:
        self.problems.append(f"line {getattr(node, 'lineno', '?')}: {message}")

    def resolve(self, node: ast.AST) -> str:
        name = dotted(node)
        head, _, rest = name.partition(".")
        return (self.aliases.get(head, head) + ("." + rest if rest else "")) if name else ""

    # -- imports -------------------------------------------------------------------------------

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._check_module(node, alias.name)
            self.aliases[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else alias.name.split(".")[0]

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            self.fail(node, "relative imports are not allowed (a kernel is one module)")
            return
        self._check_module(node, node.module or "")
        for alias in node.names:
            if alias.name in DENIED_ATTRIBUTES or alias.name == "*":
                self.fail(node, f"`from {node.module} import {alias.name}` is not allowed")
            self.aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"

    def _check_module(self, node: ast.AST, module: str) -> None:
        root = module.split(".")[0]
        if root not in ALLOWED_IMPORTS:
            self.fail(node, f"imports {module!r}; a kernel may import only {', '.join(sorted(ALLOWED_IMPORTS - {'__future__'}))}")
        elif any(part in DENIED_ATTRIBUTES for part in module.split(".")[1:]):
            self.fail(node, f"imports {module!r}, which is off limits (streams, native code, torch internals)")

    # -- names and attributes ------------------------------------------------------------------

    def visit_Name(self, node: ast.Name) -> None:
        if node.id in DENIED_NAMES:
            self.fail(node, f"uses `{node.id}`, which can reach or change the evaluator; it is not allowed")
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr in DENIED_ATTRIBUTES:
            self.fail(node, f"uses `.{node.attr}` ({self.resolve(node) or 'attribute'}); extra streams, timers, "
                      "tensor subclasses, introspection and native code are not allowed")
        elif node.attr in DENIED_LIBRARY_ATTRIBUTES and self.resolve(node).split(".")[0] in ("torch", "numpy"):
            self.fail(node, f"uses `{self.resolve(node)}`, which unpickles (runs code the rules never saw)")
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        if isinstance(node.func, ast.Name) and node.func.id == "getattr":
            name = node.args[1] if len(node.args) > 1 else None
            if not (isinstance(name, ast.Constant) and isinstance(name.value, str)):
                self.fail(node, "getattr with a computed name is not allowed")
            elif name.value in DENIED_ATTRIBUTES:
                self.fail(node, f"getattr(..., {name.value!r}) is not allowed")
        if isinstance(node.func, ast.Name) and node.func.id == "type" and len(node.args) == 3:
            self.fail(node, "creating classes with type(name, bases, dict) is not allowed")
        self.generic_visit(node)

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
            if root in ("self", "cls"):
                return
            if verb == "assigns to" and any(full.startswith(p) for p in ASSIGNABLE_PREFIXES):
                return
            self.fail(target, f"{verb} `{full or dotted(target) or 'an attribute'}`: changing attributes of "
                      f"modules or library objects is not allowed (only {', '.join(p + '*' for p in ASSIGNABLE_PREFIXES)} flags)")
        elif isinstance(target, ast.Subscript):
            base = self.resolve(target.value)
            if base and base.split(".")[0] in ALLOWED_IMPORTS and base.count(".") >= 1:
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
                self.fail(node, f"class {node.name} subclasses {name}: tensor subclasses and torch modes are not allowed")
        self.generic_visit(node)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        if any(self.resolve(d.func if isinstance(d, ast.Call) else d).split(".")[-1] == "jit"
               and self.resolve(d.func if isinstance(d, ast.Call) else d).startswith("triton") for d in node.decorator_list):
            self.jit_kernels.append(node.name)
        if node.name == ENTRY_POINT and node in self.top_level:
            self.has_entry = True
        self.generic_visit(node)

    visit_AsyncFunctionDef = visit_FunctionDef

    def run(self, tree: ast.Module) -> None:
        self.top_level = set(tree.body)
        for node in tree.body:  # `custom_kernel = torch.compile(fn)` defines the entry point too
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == ENTRY_POINT for t in node.targets):
                self.has_entry = True
        self.visit(tree)


def check_source(source: str) -> list[str]:
    """Every broken rule of the kernel `source`, in source order; empty when it may run."""
    try:
        tree = ast.parse(source)
    except SyntaxError as err:
        return [f"syntax error: {err.msg} (line {err.lineno})"]
    except ValueError as err:  # null bytes
        return [f"cannot parse the kernel: {err}"]
    rules = _Rules()
    rules.run(tree)
    problems = list(rules.problems)
    if not rules.has_entry:
        problems.append(f"defines no top-level function `{ENTRY_POINT}(data)`")
    if not rules.jit_kernels:
        problems.append("defines no @triton.jit kernel: at least part of the work must be written in Triton")
    return problems
