"""What the SGLang adapter checks of the installed SGLang before it relies on it (the contract).

Every function here compares a name or signature in :mod:`.upstream_api` with the installed package
and returns the problems it finds (an empty list: the contract holds). The adapter calls them at
start-up; ``tests/test_sglang_contract.py`` calls them against the real package and shows each one
failing on a wrong name.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import typing
from pathlib import Path

from ..interface import EngineError
from . import upstream_api as api
from .upstream_api import TESTED_VERSIONS

__all__ = [
    "version_tested",
    "resolve",
    "algorithm",
    "server_args_fields",
    "check_server_args",
    "builtin_algorithms",
    "load_plugins",
    "probe_algorithm",
    "probe_ddtree",
    "check_register_api",
    "check_engine_api",
    "check_sampling_keys",
    "check_meta_keys",
    "finish_types",
    "check_finish_types",
]


def version_tested(version: str) -> bool:
    return any(version == v or version.startswith(v + ".") for v in TESTED_VERSIONS)


def resolve(path: str):
    """Import ``module:attr`` (attr may be dotted)."""
    module_name, _, attr = path.partition(":")
    obj = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


# -- ServerArgs ------------------------------------------------------------------------------------
def server_args_fields() -> dict[str, object]:
    """Field name -> annotation of the installed ``ServerArgs`` (a msgspec Struct, server_args.py:551)."""
    import msgspec

    server_args = resolve(api.SERVER_ARGS)
    return {f.name: f.type for f in msgspec.structs.fields(server_args)}


def _choices(annotation) -> list | None:
    """The ``Arg(choices=...)`` of an ``Annotated[T, Arg(...)]`` field (arg_groups/arg_utils.py), if any."""
    for meta in typing.get_args(annotation)[1:] if typing.get_origin(annotation) is typing.Annotated else ():
        choices = getattr(meta, "choices", None)
        if choices:
            return list(choices)
    return None


def check_server_args(kwargs: dict) -> list[str]:
    """Problems with ``kwargs`` as ``sgl.Engine(**kwargs)`` / ``ServerArgs(**kwargs)`` arguments.

    Each key must be a ServerArgs field, each value must convert to the field's type (msgspec, which
    validates; the Struct's own constructor does not) and lie in the field's ``choices`` if it has
    any. An empty list means SGLang will accept them at construction.
    """
    import msgspec

    fields = server_args_fields()
    problems = []
    for key, value in kwargs.items():
        if key not in fields:
            problems.append(f"ServerArgs has no field {key!r}")
            continue
        annotation = fields[key]
        try:
            msgspec.convert(value, type=annotation)
        except (msgspec.ValidationError, TypeError) as exc:
            problems.append(f"ServerArgs.{key} = {value!r}: {exc}")
            continue
        choices = _choices(annotation)
        if choices is not None and value is not None and value not in choices:
            problems.append(f"ServerArgs.{key} = {value!r} is not one of {choices}")
    return problems


# -- speculative algorithms --------------------------------------------------------------------------
def builtin_algorithms() -> list[str]:
    """Members of the installed ``SpeculativeAlgorithm`` enum, less ``NONE``."""
    spec = resolve(api.SPEC_ALGORITHM)
    return [m for m in spec.__members__ if m != api.NO_ALGORITHM]


def load_plugins() -> None:
    """Run SGLang's general plugins (entry points ``sglang.srt.plugins``), as ``sgl.Engine`` does first.

    Idempotent in SGLang (plugins/__init__.py:119-122). Plugins register out-of-tree algorithms
    through ``SpeculativeAlgorithm.register``.
    """
    resolve(api.LOAD_PLUGINS)()


def algorithm(name: str):
    """The installed algorithm object for ``name`` (enum member or registered plugin), or None."""
    spec = resolve(api.SPEC_ALGORITHM)
    if name.upper() == api.NO_ALGORITHM:
        return None
    try:
        return getattr(spec, api.FROM_STRING)(name)
    except ValueError:
        return None


def probe_algorithm(name: str) -> tuple[bool, str]:
    """Whether the installed SGLang knows speculative algorithm ``name`` (builtin or registered), and why not."""
    if algorithm(name) is not None:
        return True, ""
    return False, (
        f"SpeculativeAlgorithm has no algorithm {name!r} (builtins: {', '.join(builtin_algorithms())}; "
        f"none registered under that name through SpeculativeAlgorithm.{api.REGISTER} or a "
        f"{api.PLUGINS_GROUP} plugin)"
    )


def probe_ddtree(algorithm: str, budget_arg: str) -> tuple[bool, str]:
    """Whether this SGLang offers DDTree as ``algorithm`` with its budget in ServerArgs field ``budget_arg``."""
    ok, why = probe_algorithm(algorithm)
    missing_field = budget_arg not in server_args_fields()
    if ok and not missing_field:
        return True, ""
    reasons = [why] if not ok else []
    if missing_field:
        reasons.append(f"ServerArgs has no budget field {budget_arg!r}")
    return False, "; ".join(reasons)


def check_register_api() -> list[str]:
    """Problems with ``SpeculativeAlgorithm.register`` against the parameters in :mod:`.upstream_api`."""
    spec = resolve(api.SPEC_ALGORITHM)
    register = getattr(spec, api.REGISTER, None)
    if not callable(register):
        return [f"SpeculativeAlgorithm.{api.REGISTER} is missing"]
    params = inspect.signature(register).parameters
    problems = [
        f"SpeculativeAlgorithm.{api.REGISTER} has no parameter {p!r}" for p in api.REGISTER_PARAMS if p not in params
    ]
    if not callable(getattr(spec, api.FROM_STRING, None)):
        problems.append(f"SpeculativeAlgorithm.{api.FROM_STRING} is missing")
    return problems


# -- engine API, sampling params, meta_info (read without importing GPU-only modules) --------------
def _module_source(module_name: str) -> tuple[str, str]:
    spec = importlib.util.find_spec(module_name)
    if spec is None or not spec.origin:
        raise EngineError(f"engine 'sglang': module {module_name} not found in the installed SGLang")
    return spec.origin, Path(spec.origin).read_text()


def check_engine_api(
    path: str = api.ENGINE, methods=api.ENGINE_METHODS, generate_kwargs=api.GENERATE_KWARGS
) -> list[str]:
    """Problems with the offline engine class: its methods and ``generate``'s keyword arguments.

    Read from the source (ast): ``srt/entrypoints/engine.py`` imports GPU-only packages at module
    level (flashinfer's TVM FFI, torchvision), which a CPU contract venv does not have.
    """
    module_name, _, class_name = path.partition(":")
    origin, source = _module_source(module_name)
    classes = [n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == class_name]
    if not classes:
        return [f"{origin}: no class {class_name}"]
    defs = {n.name: n for n in classes[0].body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    problems = [f"{class_name}.{m} is missing" for m in methods if m not in defs]
    if "generate" in defs:
        args = defs["generate"].args
        have = {a.arg for a in args.args + args.kwonlyargs}
        problems += [f"{class_name}.generate has no parameter {k!r}" for k in generate_kwargs if k not in have]
    return problems


def check_sampling_keys(keys=api.SAMPLING_KEYS) -> list[str]:
    import msgspec

    fields = {f.name for f in msgspec.structs.fields(resolve(api.SAMPLING_PARAMS))}
    return [f"SamplingParams has no field {k!r}" for k in keys if k not in fields]


def check_meta_keys(keys=api.META_KEYS, module_name: str = api.META_SOURCE_MODULE) -> list[str]:
    """Keys that never appear as a string literal in the module that builds ``meta_info``."""
    origin, source = _module_source(module_name)
    literals = {
        n.value for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Constant) and isinstance(n.value, str)
    }
    return [f"{origin} never produces meta_info key {k!r}" for k in keys if k not in literals]


def finish_types(module_name: str = api.FINISH_SOURCE_MODULE) -> set[str]:
    """The ``"type"`` values that the finish-reason classes' ``to_json`` produce (read by source)."""
    _, source = _module_source(module_name)
    found: set[str] = set()
    for cls in ast.walk(ast.parse(source)):
        if not isinstance(cls, ast.ClassDef):
            continue
        for fn in cls.body:
            if not (isinstance(fn, ast.FunctionDef) and fn.name == "to_json"):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.Dict):
                    for k, v in zip(node.keys, node.values):
                        if (
                            isinstance(k, ast.Constant)
                            and k.value == api.META_FINISH_TYPE
                            and isinstance(v, ast.Constant)
                        ):
                            found.add(v.value)
    return found


def check_finish_types(mapped=None, module_name: str = api.FINISH_SOURCE_MODULE) -> list[str]:
    """Mapped finish types that SGLang never produces."""
    produced = finish_types(module_name)
    mapped = api.FINISH_TYPES if mapped is None else mapped
    return [
        f"SGLang never reports finish type {t!r} (it reports: {', '.join(sorted(produced))})"
        for t in mapped
        if t not in produced
    ]


# -- processes ---------------------------------------------------------------------------------------
