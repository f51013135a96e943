""""Write it yourself": notice when a learner's function uses code the exercise forbids.

An exercise declares what it forbids as ``{dotted name: phrase}``, for example
``{"mha_course.softmax": "write the masking yourself"}``; the phrase completes "Exercise NN.M
asks you to ...". A name is a function or method (``mha_course.softmax``,
``mha_course.naive.matmul``, ``mha_course.MultiHeadAttention.forward``, ``torch.softmax``) or a
whole module or package (``numpy``, ``torch``): then everything in it is forbidden.

:func:`~mha_course.checks.harness.call` looks twice, and reports the first use it finds:

1. :func:`find_in_source` reads the learner's function (``inspect.getsource``, which works for
   notebook cells) and resolves each name it uses through the function's globals and
   closure, so aliases (``import numpy as xp``, ``from mha_course import softmax as sm``) are
   caught, and follows the learner's own helper functions a few levels deep. This is what sees
   NumPy's ufuncs (``np.exp``) and dispatchers (``np.concatenate``), which run no Python code.
2. :class:`CallWatch` runs the function under a profiler (``sys.setprofile``, the previous one
   restored afterwards and called meanwhile) that records calls into forbidden Python code
   (by code object, or by file under a forbidden package's folder) and forbidden builtins. This
   sees what the source does not show: ``layer(x)`` on an argument, a call made through
   another library.

Only the learner's call is watched: what the check computes before and after (the reference,
the known wrong versions) never counts. A name whose top-level package is not imported yet is
not imported for this (importing PyTorch takes seconds): the learner's code cannot be holding
it, except through an import inside the function, which step 1 matches by name. A package that
is not installed is simply never found.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import inspect
import os
import sys
import textwrap
import types
from dataclasses import dataclass

#: How many levels of the learner's own helper functions step 1 follows.
HELPER_DEPTH = 3


@dataclass
class Rule:
    """One forbidden name, resolved (``target`` is None when its package is not imported)."""

    name: str
    phrase: str
    target: object = None
    module: str = ""  # for a module or package: its name, so "numpy.linalg" is inside "numpy"
    folder: str = ""  # for a module or package: its file or folder, matched against code files


@dataclass
class Use:
    """A forbidden use found: which rule, the name as written, its dotted name, and where."""

    rule: Rule
    written: str
    canonical: str
    helper: str = ""

    def message(self, ex: str) -> str:
        """``Exercise NN.M asks you to <phrase>; your answer calls <name>``."""
        name = self.written
        if self.canonical and self.canonical != self.written:
            name += f" ({self.canonical})"
        if self.helper:
            name += f" in your function `{self.helper}`"
        return f"Exercise {ex} asks you to {self.rule.phrase}; your answer calls {name}"


def resolve(name: str):
    """The object a dotted name means, or None; never imports a package not imported yet.

    Attributes are followed first (``mha_course.softmax`` is the function, not the module of
    that name); where an attribute shadows its module, the module is looked in too
    (``mha_course.softmax.softmax_inplace``); a submodule of an imported package is imported
    when it is not an attribute.
    """
    parts = name.split(".")
    obj = sys.modules.get(parts[0])
    for i in range(1, len(parts)):
        if obj is None:
            return None
        try:
            obj = getattr(obj, parts[i])
            continue
        except AttributeError:
            pass
        module = sys.modules.get(".".join(parts[:i]))
        if module is not None and module is not obj and hasattr(module, parts[i]):
            obj = getattr(module, parts[i])
            continue
        if not isinstance(obj, types.ModuleType):
            return None
        try:
            obj = importlib.import_module(".".join(parts[: i + 1]))
        except ImportError:
            return None
    return obj


def rules_for(forbid: dict[str, str]) -> list[Rule]:
    """Resolve ``{dotted name: phrase}`` into rules."""
    rules = []
    for name, phrase in forbid.items():
        rule = Rule(name, phrase, resolve(name))
        if isinstance(rule.target, types.ModuleType):
            rule.module = rule.target.__name__
            paths = list(getattr(rule.target, "__path__", None) or [])
            file = getattr(rule.target, "__file__", None) or ""
            rule.folder = os.path.join(paths[0], "") if paths else file
        rules.append(rule)
    return rules


def dotted_name(obj) -> str:
    """``module.qualname`` of a module, function, class or callable object (or "")."""
    if isinstance(obj, types.ModuleType):
        return obj.__name__
    try:
        module = getattr(obj, "__module__", None)
        owner = getattr(obj, "__self__", None)
        if not isinstance(module, str) and isinstance(owner, types.ModuleType):
            module = owner.__name__
        name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
        if not isinstance(name, str):
            name = type(obj).__qualname__
    except Exception:  # a learner's object with a strange __getattr__
        return ""
    return f"{module}.{name}" if isinstance(module, str) else name


def _in_module(module_name, rule: Rule) -> bool:
    return isinstance(module_name, str) and (
        module_name == rule.module or module_name.startswith(rule.module + ".")
    )


def _func(obj):
    """The function under a bound method, a classmethod or a staticmethod (else ``obj``)."""
    return getattr(obj, "__func__", obj)


def matches(rule: Rule, obj) -> bool:
    """Whether using ``obj`` breaks ``rule``: the very object, or anything from its module."""
    if rule.target is None or obj is None:
        return False
    try:
        if obj is rule.target or _func(obj) is _func(rule.target):
            return True  # the function itself, or a (class)method bound to it
        if not rule.module:
            return False
        if isinstance(obj, types.ModuleType):
            return _in_module(obj.__name__, rule)
        if not callable(obj):
            return False
        owner = getattr(obj, "__self__", None)
        return (_in_module(getattr(obj, "__module__", None), rule)
                or (isinstance(owner, types.ModuleType) and _in_module(owner.__name__, rule))
                or (owner is not None and _in_module(type(owner).__module__, rule)))
    except Exception:  # a learner's object with a strange __getattr__
        return False


def first_match(rules, obj) -> Rule | None:
    return next((rule for rule in rules if matches(rule, obj)), None)


# ------------------------------------------------------------------ 1. reading the source


def _syntax_of(fn):
    """The ``def`` or ``lambda`` node of ``fn`` from its source, or None when unavailable."""
    try:
        source = textwrap.dedent(inspect.getsource(fn))
        tree = ast.parse(source)
    except (OSError, TypeError, SyntaxError, IndentationError):
        return None
    code = fn.__code__
    if fn.__name__ == "<lambda>":
        params = list(code.co_varnames[: code.co_argcount])
        lambdas = [n for n in ast.walk(tree) if isinstance(n, ast.Lambda)
                   and [a.arg for a in n.args.posonlyargs + n.args.args] == params]
        return lambdas[0] if len(lambdas) == 1 else None
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == fn.__name__:
            return node
    return None


def _local_names(node) -> tuple[set[str], dict[str, str]]:
    """Names bound inside the function, and the dotted names its own imports bind."""
    bound, declared, imported = set(), set(), {}
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name) and isinstance(sub.ctx, (ast.Store, ast.Del)):
            bound.add(sub.id)
        elif isinstance(sub, ast.arg):
            bound.add(sub.arg)
        elif isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if sub is not node:
                bound.add(sub.name)
        elif isinstance(sub, ast.ExceptHandler) and sub.name:
            bound.add(sub.name)
        elif isinstance(sub, (ast.Global, ast.Nonlocal)):
            declared.update(sub.names)
        elif isinstance(sub, ast.Import):
            for alias in sub.names:
                top = alias.name.split(".")[0]
                imported[alias.asname or top] = alias.name if alias.asname else top
        elif isinstance(sub, ast.ImportFrom) and sub.level == 0 and sub.module:
            for alias in sub.names:
                imported[alias.asname or alias.name] = f"{sub.module}.{alias.name}"
    return bound - declared, imported


def _lookup(fn, name: str):
    """``(found, object)`` for a free name of ``fn``: its closure, its globals, the builtins."""
    code = fn.__code__
    if name in code.co_freevars and fn.__closure__:
        try:
            return True, fn.__closure__[code.co_freevars.index(name)].cell_contents
        except ValueError:  # an empty cell
            return False, None
    if name in fn.__globals__:
        return True, fn.__globals__[name]
    space = fn.__globals__.get("__builtins__", builtins)
    space = space if isinstance(space, dict) else vars(space)
    return (name in space), space.get(name)


def _attribute(obj, name: str):
    """``obj.name`` without running a learner's code (no properties, no ``__getattr__``)."""
    if isinstance(obj, types.ModuleType):
        return getattr(obj, name, None)
    try:
        value = inspect.getattr_static(obj, name)
    except AttributeError:
        return None
    return value.__func__ if isinstance(value, (staticmethod, classmethod)) else value


def _chains(body):
    """``(written text, [name, attr, ...])`` for every name and maximal attribute chain read."""
    values = set()
    nodes = [n for part in body for n in ast.walk(part)]
    for node in nodes:
        if isinstance(node, ast.Attribute):
            values.add(id(node.value))
    for node in nodes:
        if id(node) in values or not isinstance(node, (ast.Name, ast.Attribute)):
            continue
        if not isinstance(node.ctx, ast.Load):
            continue
        parts, inner = [], node
        while isinstance(inner, ast.Attribute):
            parts.insert(0, inner.attr)
            inner = inner.value
        if isinstance(inner, ast.Name):
            yield ast.unparse(node), [inner.id, *parts]


def find_in_source(fn, rules, helper: str = "", depth: int = 0, seen=None) -> Use | None:
    """The first forbidden name the source of ``fn`` (and of its helpers) uses, or None."""
    fn = inspect.unwrap(getattr(fn, "__func__", fn))
    if not isinstance(fn, types.FunctionType) or not rules:
        return None
    seen = set() if seen is None else seen
    if fn.__code__ in seen:
        return None
    seen.add(fn.__code__)
    node = _syntax_of(fn)
    if node is None:
        return None
    bound, imported = _local_names(node)
    body = node.body if isinstance(node.body, list) else [node.body]
    helpers = []
    for written, parts in _chains(body):
        base, rest = parts[0], parts[1:]
        if base in imported:
            dotted = ".".join([imported[base], *rest])
            for rule in rules:
                if rule.target is None and (dotted == rule.name
                                            or dotted.startswith(rule.name + ".")):
                    return Use(rule, written, rule.name, helper)
            objects = [resolve(".".join([imported[base], *rest[:i]]))
                       for i in range(len(rest) + 1)]
        elif base in bound:
            continue
        else:
            found, obj = _lookup(fn, base)
            if not found:
                continue
            objects = [obj]
            for attr in rest:
                obj = _attribute(obj, attr) if obj is not None else None
                objects.append(obj)
        for i in range(len(objects) - 1, -1, -1):  # the longest chain first: np.linalg.norm
            rule = first_match(rules, objects[i])
            if rule is not None:
                text = ".".join(parts[: i + 1]) if i < len(rest) else written
                same = _func(objects[i]) is _func(rule.target)
                canonical = rule.name if same else dotted_name(objects[i])
                return Use(rule, text, canonical, helper)
        last = objects[-1]
        if (isinstance(last, types.FunctionType) and last.__globals__ is fn.__globals__
                and depth < HELPER_DEPTH):
            helpers.append(last)  # the learner's own helper: read it too
    for other in helpers:
        use = find_in_source(other, rules, other.__name__, depth + 1, seen)
        if use is not None:
            return use
    return None


# ------------------------------------------------------------------ 2. watching the call


def _codes_of(target) -> list:
    """The code objects that calling ``target`` runs first (a function, method or class)."""
    target = inspect.unwrap(getattr(target, "__func__", target)) if callable(target) else target
    if isinstance(target, types.FunctionType):
        return [target.__code__]
    if isinstance(target, type):
        found = []
        for value in vars(target).values():
            value = getattr(value, "__func__", value)
            if isinstance(value, types.FunctionType):
                found.append(value.__code__)
        return found
    return []


class CallWatch:
    """Run a function under a profiler that records the first call into forbidden code."""

    def __init__(self, rules):
        self.rules = [rule for rule in rules if rule.target is not None]
        self.codes = {}
        for rule in self.rules:
            for code in _codes_of(rule.target):
                self.codes.setdefault(code, rule)
        self.folders = tuple((rule.folder, rule) for rule in self.rules if rule.folder)
        self.found: Use | None = None
        self.previous = None

    def run(self, fn, args, kwargs):
        """``fn(*args, **kwargs)`` with the profiler on; ``self.found`` tells what it saw."""
        self.previous = sys.getprofile()
        sys.setprofile(self.hook)
        try:
            return fn(*args, **kwargs)
        finally:
            sys.setprofile(self.previous)

    def hook(self, frame, event, arg):
        if self.found is None:
            if event == "call":
                self.found = self._python_call(frame)
            elif event == "c_call":
                rule = first_match(self.rules, arg)
                if rule is not None:
                    name = rule.name if _func(arg) is _func(rule.target) else dotted_name(arg)
                    self.found = Use(rule, name, name)
        if self.previous is not None:
            self.previous(frame, event, arg)

    def _python_call(self, frame) -> Use | None:
        code = frame.f_code
        rule = self.codes.get(code)
        if rule is not None:
            return Use(rule, rule.name, rule.name)
        for folder, rule in self.folders:
            if code.co_filename.startswith(folder):
                qualname = getattr(code, "co_qualname", code.co_name)
                name = f"{frame.f_globals.get('__name__', '?')}.{qualname}"
                return Use(rule, name, name)
        return None
