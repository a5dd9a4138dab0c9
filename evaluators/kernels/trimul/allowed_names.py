"""What a TriMul kernel may name (docs/method.md §5c, the allow-list): the modules it may import, the
names of each module it may use, and the builtins it may call. Everything else is refused by
static_rules.py, so a name that a library re-exports by accident (`torch.os`, `torch.sys`,
`typing.sys`, `triton.language.core.builtins`) is refused without anyone having listed it.

The lists are what tensor programming in PyTorch and Triton needs: creation, shape and dtype
handling, elementwise and reduction maths, matmuls and norms, the Triton language and its launch
helpers, backend precision flags. Nothing here reads or writes files, starts threads, processes or
streams, loads native code, unpickles, or reaches the interpreter's internals.
"""

from __future__ import annotations

# module path -> names it may be used with (`torch.einsum`, `tl.load`); a namespace listed here
# (torch.nn.functional) may be named only as the start of a longer chain, never as a value.
_TORCH = {
    # dtypes and devices
    "float32", "float16", "bfloat16", "float64", "float", "half", "double", "int8", "int16", "int32", "int64",
    "uint8", "bool", "long", "int", "float8_e4m3fn", "float8_e5m2", "dtype", "device", "Size", "Tensor",
    "finfo", "iinfo", "promote_types", "result_type", "get_default_dtype", "is_tensor", "is_floating_point",
    # creation
    "empty", "empty_like", "empty_strided", "zeros", "zeros_like", "ones", "ones_like", "full", "full_like",
    "arange", "linspace", "tensor", "as_tensor", "as_strided", "eye", "tril", "triu",
    # shapes
    "reshape", "permute", "transpose", "flatten", "unsqueeze", "squeeze", "broadcast_to", "cat", "concat",
    "stack", "split", "chunk", "narrow", "select", "index_select", "gather", "scatter", "flip", "roll",
    "movedim", "t", "unbind", "masked_fill", "where", "numel",
    # maths
    "einsum", "matmul", "mm", "bmm", "baddbmm", "addmm", "addbmm", "mul", "add", "sub", "div", "pow", "square",
    "exp", "exp2", "log", "log2", "log1p", "expm1", "sqrt", "rsqrt", "sigmoid", "tanh", "relu", "erf", "abs",
    "sign", "neg", "reciprocal", "clamp", "clip", "maximum", "minimum", "max", "min", "amax", "amin", "sum",
    "mean", "var", "std", "var_mean", "prod", "cumsum", "norm", "softmax", "log_softmax", "layer_norm",
    "outer", "dot", "tensordot", "lerp", "addcmul", "addcdiv", "floor", "ceil", "round", "argmax", "argmin",
    "topk", "sort", "isfinite", "isnan", "isinf", "nan_to_num", "allclose", "equal", "fmod", "remainder",
    # autograd off, precision, compilation (inside the kernel's own process)
    "no_grad", "inference_mode", "set_float32_matmul_precision", "compile",
}
_TORCH_CUDA = {"is_available", "current_device", "device_count", "get_device_properties", "get_device_capability",
               "get_device_name", "synchronize"}
_TORCH_NN = {"functional", "Module", "Linear", "LayerNorm", "Parameter", "Sequential", "ModuleList"}
_TORCH_NN_FUNCTIONAL = {"linear", "layer_norm", "group_norm", "rms_norm", "sigmoid", "relu", "gelu", "silu", "softmax",
                        "log_softmax", "pad", "normalize", "one_hot", "scaled_dot_product_attention", "dropout"}
# Backend precision flags a kernel may read or set: torch.backends.cuda.matmul.allow_tf32 = True.
_MATMUL_FLAGS = {"allow_tf32", "allow_fp16_reduced_precision_reduction", "allow_bf16_reduced_precision_reduction"}
_CUDNN_FLAGS = {"allow_tf32", "benchmark", "deterministic", "enabled"}
_TRITON = {"jit", "autotune", "heuristics", "Config", "cdiv", "next_power_of_2", "language"}
# triton.language.__all__ of Triton 3.6, less its submodules (core, math, extra, target_info).
_TL = {
    "PropagateNan", "TRITON_MAX_TENSOR_NUMEL", "abs", "add", "advance", "arange", "argmax", "argmin",
    "associative_scan", "assume", "atomic_add", "atomic_and", "atomic_cas", "atomic_max", "atomic_min", "atomic_or",
    "atomic_xchg", "atomic_xor", "bfloat16", "bitonic_merge", "block_type", "broadcast", "broadcast_to", "cast",
    "cat", "cdiv", "ceil", "clamp", "condition", "const", "constexpr", "constexpr_type", "cos", "cumprod", "cumsum",
    "debug_barrier", "device_assert", "device_print", "div_rn", "dot", "dot_scaled", "dtype", "erf", "exp", "exp2",
    "expand_dims", "fdiv", "flip", "float16", "float32", "float64", "float8e4b15", "float8e4b8", "float8e4nv",
    "float8e5", "float8e5b16", "floor", "fma", "full", "gather", "histogram", "int1", "int16",
    "int32", "int64", "int8", "interleave", "join", "load", "load_tensor_descriptor", "log", "log2", "make_block_ptr",
    "make_tensor_descriptor", "map_elementwise", "max", "max_constancy", "max_contiguous", "maximum", "min", "minimum",
    "mul", "multiple_of", "num_programs", "pair_uniform_to_normal", "permute", "philox", "pi32_t", "pointer_type",
    "program_id", "rand", "rand4x", "randint", "randint4x", "randn", "randn4x", "range", "ravel", "reduce", "reduce_or",
    "reshape", "rsqrt", "sigmoid", "sin", "slice", "softmax", "sort", "split", "sqrt", "sqrt_rn", "static_assert",
    "static_print", "static_range", "store", "store_tensor_descriptor", "sub", "sum", "swizzle2d", "tensor",
    "tensor_descriptor", "topk", "trans", "tuple", "uint16", "uint32", "uint64", "uint8", "uint_to_uniform_float",
    "umulhi", "view", "void", "where", "xor_sum", "zeros", "zeros_like", "math", "extra",
}
# Device maths: tl.math.tanh, tl.extra.cuda.libdevice.tanh.
_DEVICE_MATHS = {
    "abs", "ceil", "cos", "div_rn", "erf", "exp", "exp2", "fdiv", "floor", "fma", "log", "log2", "max", "min", "rsqrt",
    "sin", "sqrt", "sqrt_rn", "umulhi", "tanh", "pow", "log1p", "expm1", "round", "rint", "atan", "atan2", "tan",
    "sinh", "cosh", "erfinv", "fast_expf", "fast_dividef", "fast_logf", "exp10", "trunc", "isnan", "isinf",
}
_MATH = {
    "pi", "e", "inf", "nan", "tau", "sqrt", "exp", "log", "log2", "log10", "pow", "ceil", "floor", "prod", "isqrt",
    "gcd", "lcm", "fabs", "tanh", "erf", "sin", "cos", "isfinite", "isnan", "isinf", "inf", "trunc", "copysign",
}
_TYPING = {"Any", "Optional", "Tuple", "List", "Dict", "Union", "Callable", "Sequence", "Iterable", "Mapping",
           "TYPE_CHECKING", "NamedTuple", "Literal", "Final", "TypeVar", "cast", "overload"}

MODULE_NAMES: dict[str, frozenset[str]] = {
    "torch": frozenset(_TORCH | {"cuda", "nn", "backends"}),
    "torch.cuda": frozenset(_TORCH_CUDA),
    "torch.nn": frozenset(_TORCH_NN),
    "torch.nn.functional": frozenset(_TORCH_NN_FUNCTIONAL),
    "torch.backends": frozenset({"cuda", "cudnn"}),
    "torch.backends.cuda": frozenset({"matmul"}),
    "torch.backends.cuda.matmul": frozenset(_MATMUL_FLAGS),
    "torch.backends.cudnn": frozenset(_CUDNN_FLAGS),
    "triton": frozenset(_TRITON),
    "triton.language": frozenset(_TL),
    "triton.language.math": frozenset(_DEVICE_MATHS),
    "triton.language.extra": frozenset({"cuda", "libdevice"}),
    "triton.language.extra.cuda": frozenset({"libdevice"}),
    "triton.language.extra.cuda.libdevice": frozenset(_DEVICE_MATHS),
    "triton.language.extra.libdevice": frozenset(_DEVICE_MATHS),
    "math": frozenset(_MATH),
    "typing": frozenset(_TYPING),
}
# Modules a kernel may import (`import torch.nn.functional as F`, `from triton import language as tl`).
IMPORTABLE = frozenset({"torch", "torch.nn", "torch.nn.functional", "triton", "triton.language", "math", "typing",
                        "__future__"})
# Module paths whose names are flags a kernel may assign (`torch.backends.cudnn.allow_tf32 = False`).
ASSIGNABLE_MODULES = frozenset({"torch.backends.cuda.matmul", "torch.backends.cudnn"})

# Builtins a kernel may name; getattr, setattr, eval, exec, compile, open, __import__, globals, vars,
# locals, breakpoint, dir, input, memoryview and the rest are not on it.
BUILTINS = frozenset({
    "abs", "all", "any", "bool", "callable", "dict", "divmod", "enumerate", "filter", "float", "frozenset", "hash",
    "int", "isinstance", "issubclass", "iter", "len", "list", "map", "max", "min", "next", "object", "pow", "print",
    "range", "repr", "reversed", "round", "set", "slice", "sorted", "str", "sum", "super", "tuple", "type", "zip",
    "property", "staticmethod", "classmethod", "NotImplemented", "Ellipsis", "__name__",
    "Exception", "ValueError", "TypeError", "RuntimeError", "KeyError", "IndexError", "AssertionError",
    "NotImplementedError", "ZeroDivisionError", "AttributeError", "ArithmeticError", "OverflowError", "StopIteration",
})
# Builtins named in refusals with what they would give (a clearer message than "not allowed").
DANGEROUS_BUILTINS = {
    "getattr": "reaches any attribute by a name built at run time", "setattr": "changes any object",
    "delattr": "changes any object", "eval": "runs code the rules never saw", "exec": "runs code the rules never saw",
    "compile": "runs code the rules never saw", "__import__": "imports any module", "open": "reads and writes files",
    "globals": "reaches the module's namespace", "locals": "reaches a frame's namespace", "vars": "reaches any namespace",
    "dir": "lists names to build at run time", "breakpoint": "starts a debugger", "input": "reads the terminal",
    "memoryview": "reads raw memory", "__builtins__": "reaches every builtin", "exit": "ends the process",
    "quit": "ends the process",
}
# Attributes refused on any object (the kernel's own values too): frames and tracebacks, files,
# storages and tensor subclasses. Names starting with "_" are refused everywhere.
OBJECT_ATTRIBUTES_REFUSED = {
    "tb_frame": "a frame", "tb_next": "a traceback", "f_back": "a frame", "f_globals": "a frame's namespace",
    "f_locals": "a frame's namespace", "f_builtins": "every builtin", "f_code": "code", "gi_frame": "a frame",
    "gi_code": "code", "cr_frame": "a frame", "cr_code": "code", "ag_frame": "a frame", "co_code": "code",
    "co_consts": "code", "tofile": "files", "fromfile": "files", "from_file": "files", "save": "files",
    "load": "files (and unpickling)", "loads": "unpickling", "untyped_storage": "raw storage", "storage": "raw storage",
    "share_memory_": "shared memory", "as_subclass": "tensor subclasses", "register_hook": "hooks",
    "with_traceback": "a traceback", "format_map": "attribute lookups by name", "mro": "the class hierarchy",
}
# Methods a kernel may define with a dunder name (everything else, e.g. __torch_function__, is refused).
DUNDER_DEFINITIONS = frozenset({"__init__", "__call__", "__repr__"})
