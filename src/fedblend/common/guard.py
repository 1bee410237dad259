"""The one guard around every call into code fedblend did not write.

fedblend calls user code in a few places: a method's and its transforms' hooks (server half and client half, in
this process, in worker processes, in the vmap backend's lock-step driver, on Flower nodes), a plug-in's
construction and options, a dataset plug-in's loader, a model plug-in's builder, and the trackers. Each call
site wraps the call in :func:`guarded`; an exception from the call becomes one
:class:`~fedblend.common.errors.HookError` line naming

* the plug-in (``method plug-in 'myprox' (mypkg.methods:MyProx)``; a built-in one as ``method 'fedavg'``: a
  built-in method that raises is that method's fault too),
* the hook it raised in: the innermost frame of the traceback that runs a function of the method or of one of its
  transforms (``self`` is one of them: ``loss_terms`` inside the client template, ``aggregate_train`` inside
  ``aggregate``), or data a hook made that training runs (a :class:`~fedblend.core.training.LossTerm` failing
  inside local training: ``loss_terms``, its class's ``guard_hook``), else the hook the call site named; where
  the exception is about a None that a function of the plug-in returned and its hook used (a helper of its own
  returning None, ``personalized_params`` failing on it), that function (:func:`_returned_none`; what fedblend
  hands from hook to hook is checked first, :mod:`fedblend.core.returns`),
* the client and the round (1-based),
* the exception's type and first line, and where in the plug-in's code it was raised (the innermost frame outside
  torch and the standard library).

fedblend's own named failures (:class:`~fedblend.common.errors.FedblendError`: a reply that breaks the
contract, a divergence, a HookError of an inner guard) pass through unchanged, as do ``MemoryError`` / torch's
out-of-memory errors (the caller names them) and ``KeyboardInterrupt``. The original exception stays the
HookError's ``__cause__``: ``--debug`` shows its traceback.
"""

from __future__ import annotations

import ast
import inspect
import sys
import sysconfig
import textwrap
from collections.abc import Sequence
from contextlib import nullcontext
from pathlib import Path
from types import TracebackType
from typing import Any

from fedblend.common.errors import FedblendError, HookError

_FEDBLEND = str(Path(__file__).resolve().parents[1])


def plugin_name(obj: Any, kind: str, name: str | None = None) -> str:
    """How an error names ``obj`` (an instance, a class or a function) of ``kind``: ``"method 'fedavg'"`` for
    fedblend's own, ``"method plug-in 'myprox' (mypkg.methods:MyProx)"`` for a plug-in's."""
    target = obj if isinstance(obj, type) or _is_function(obj) else type(obj)
    module = getattr(target, "__module__", "") or ""
    qual = getattr(target, "__qualname__", "") or type(target).__name__
    if name is None and isinstance(target, type):
        own = getattr(target, "name", None)
        name = own if isinstance(own, str) and own else None
    name = name or qual
    if module == "fedblend" or module.startswith("fedblend."):
        return f"{kind} {name!r}"
    path = f"{module}:{qual}"
    return f"{kind} plug-in {name!r}" + ("" if name == path else f" ({path})")


def _is_function(obj: Any) -> bool:
    return callable(obj) and not isinstance(obj, type) and hasattr(obj, "__code__")


def where_text(rnd: int | None, cid: Any = None, side: str = "server") -> str:
    """``"client 3, round 2"`` / ``"server, round 2"`` / ``"before round 1"`` (``rnd`` 0-based); ``cid`` a
    client id, a list of them (a batched computation: ``"clients 1, 4, round 2"``) or None (``side``: the
    server's, or ``""`` for what runs beside the rounds, a tracker's)."""
    if isinstance(cid, (list, tuple)):
        who = f"client {cid[0]}" if len(cid) == 1 else "clients " + ", ".join(str(c) for c in cid)
    else:
        who = side if cid is None else f"client {cid}"
    if rnd is None:
        return (who or "the run") if cid is not None or not side else "before round 1"
    return ", ".join([*([who] if who else []), f"round {rnd + 1}"])


class guarded:  # noqa: N801 - used as a context manager, like contextlib's
    """``with guarded(owner, kind, hook, rnd, cid):`` runs the body as a call into ``owner`` (a ``kind``: method,
    transform, dataset, model, tracker) at its ``hook``, for client ``cid`` (None: the server's side) in round
    ``rnd`` (0-based; None: before the run's first round); an exception becomes a :class:`HookError` (module
    docstring). ``within``: the objects whose own functions count as hooks, with their kinds (a method and its
    transforms), for naming the innermost one that raised; ``name``: the plug-in's name where ``owner`` has none
    (a dataset's). ``StopIteration`` passes (a client half's generator finishing), and so do the exception types
    in ``passes`` (a constructor's ``ValueError`` refusing its options: bad input, the caller's to name)."""

    def __init__(self, owner: Any, kind: str, hook: str, rnd: int | None = None, cid: Any = None,
                 within: Sequence[tuple[Any, str]] = (), name: str | None = None, side: str = "server",
                 passes: tuple[type[BaseException], ...] = ()):
        self.args = (owner, kind, hook, rnd, cid, within, name, side)
        self.passes = passes

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if exc is None or not isinstance(exc, Exception) or isinstance(exc, _PASS + self.passes):
            return
        if _out_of_memory(exc):  # torch's (CUDA / MPS / the CPU allocator's): the caller names memory faults
            return
        raise hook_error(exc, *self.args) from exc


_PASS = (FedblendError, MemoryError, StopIteration)


def _out_of_memory(exc: BaseException) -> bool:
    text = str(exc)
    return type(exc).__name__ == "OutOfMemoryError" or "can't allocate memory" in text or \
        "out of memory" in text.lower()


def plugin_guard(owner: Any, kind: str, hook: str, rnd: int | None = None, cid: Any = None,
                 name: str | None = None) -> Any:
    """:func:`guarded` where ``owner`` is a plug-in's (not fedblend's own: a built-in dataset's or model's
    exceptions are fedblend's to name, or its bugs, and stay as they are)."""
    if _builtin(owner):
        return nullcontext()
    return guarded(owner, kind, hook, rnd, cid, name=name)


def _builtin(obj: Any) -> bool:
    """Whether ``obj`` (an instance, a class or a function) is fedblend's own."""
    module = getattr(obj if isinstance(obj, type) or _is_function(obj) else type(obj), "__module__", "")
    return (module or "").split(".")[0] == "fedblend"


def method_guard(method: Any, hook: str, rnd: int | None = None, cid: Any = None, model: Any = None):
    """:func:`guarded` for a call into ``method`` (a :class:`~fedblend.core.method.Method`): its transforms'
    hooks are named as the transform's, and where the call runs ``model`` (the run's model: a client's training
    or evaluation), an exception in one of the model's own functions (its ``forward``) as the model's."""
    within = [(method, "method"), *((t, "transform") for t in getattr(method, "transforms", ()))]
    if model is not None and not _builtin(model):  # a built-in model raising is fed wrong inputs: the method's
        within.append((model, "model"))
    return guarded(method, "method", hook, rnd, cid, within)


def hook_error(exc: BaseException, owner: Any, kind: str, hook: str, rnd: int | None = None,
               cid: Any = None, within: Sequence[tuple[Any, str]] = (), name: str | None = None,
               side: str = "server") -> HookError:
    """The :class:`HookError` that names ``exc`` raised in ``owner``'s ``hook`` (see :func:`guarded`)."""
    found = _hook_frame(exc.__traceback__, within)
    if found is not None:
        owner, kind, hook = found
    spec = _refused_spec(exc, hook, within)
    if spec is not None:  # a value a hook returned, refused where it became part of a training spec
        hook, problem = spec
        who = plugin_name(owner, kind, name)
        return HookError(f"{who}: {problem} ({where_text(rnd, cid, side)}); a fault of its code", who, hook,
                         None if rnd is None else rnd + 1, cid if isinstance(cid, int) or cid is None else list(cid))
    text = f"{type(exc).__name__}: {_first_line(exc)}" if _first_line(exc) else type(exc).__name__
    made = _returned_none(exc, within)
    if made is not None and made[2] != hook:  # the hook that returned the None, not the one that used it
        owner, kind = made[0], made[1]
        who = plugin_name(owner, kind, name)
        message = (f"{who}: {made[2]} returned None (a missing return?) ({where_text(rnd, cid, side)}), and {hook} "
                   f"failed on it: {text}; a fault of its code (fedblend --debug shows the traceback)")
        hook = made[2]
    else:
        who = plugin_name(owner, kind, name)
        at = _location(exc.__traceback__)
        message = (f"{who} raised in {hook} ({where_text(rnd, cid, side)}): {text}{f' (at {at})' if at else ''}; "
                   f"a fault of its code (fedblend --debug shows the traceback)")
    return HookError(message, who, hook, None if rnd is None else rnd + 1,
                     cid if isinstance(cid, int) or cid is None else list(cid))


def _frames(tb: TracebackType | None) -> list:
    out = []
    while tb is not None:
        out.append(tb.tb_frame)
        tb = tb.tb_next
    return out


def _hook_frame(tb: TracebackType | None, within: Sequence[tuple[Any, str]]) -> tuple[Any, str, str] | None:
    """The innermost frame of ``tb`` that runs a hook of one of the ``within`` objects -- a function named as one
    that fedblend's (or torch's) base classes define, which fedblend calls -- else the innermost that runs any
    function of theirs (a plug-in's helper): (object, kind, function name)."""
    helper = None
    for frame in reversed(_frames(tb)):
        me = frame.f_locals.get("self")
        made_by = getattr(type(me), "guard_hook", None)  # data a hook made and training runs (a LossTerm)
        if isinstance(made_by, str) and within and helper is None:
            return within[0][0], within[0][1], made_by
        for obj, kind in within:
            if me is obj:
                name = frame.f_code.co_name
                if name in _hooks(type(obj)):
                    return obj, kind, name
                helper = helper or (obj, kind, name)
    return helper


def _refused_spec(exc: BaseException, hook: str, within: Sequence[tuple[Any, str]]) -> tuple[str, str] | None:
    """(hook, problem) for a training spec's field refused as it was made (``core.training.SpecError``, whose
    ``guard_hook`` is the template hook the field comes from): that hook where the template's ``train_spec``
    made the spec (``client_init``, or with transforms ``client_init`` or their ``apply``; ``loss_terms``), else
    the hook that made the spec itself (``hook``: a method's own ``local_training``)."""
    made = getattr(exc, "guard_hook", None)
    if not isinstance(made, str):
        return None
    by_template = hook == "train_spec" or any(  # the template's helper made it (core.template.train_spec)
        f.f_code.co_name == "train_spec" and f.f_globals.get("__name__") == "fedblend.core.template"
        for f in _frames(exc.__traceback__))
    if not by_template:
        return hook, f"{hook} made a TrainSpec whose {exc.field} is {exc.got}, not {exc.want}"
    if made == "client_init" and any(kind == "transform" for _, kind in within):
        return made, f"client_init or a transform's apply returned {exc.got}, not {exc.want}"
    return made, f"{made} returned {exc.got}, not {exc.want}"


def _returned_none(exc: BaseException, within: Sequence[tuple[Any, str]]) -> tuple[Any, str, str] | None:
    """For an exception about a None (``'NoneType' object has no attribute ...``), the hook whose return value
    that None was: in the frames that run a function of the ``within`` objects, innermost first (the hook that
    failed on it, then its callers: the client template), the first to have read a local ``name`` that is None in
    its failing statement after ``name = self.<hook>(...)`` (or ``yield from``). (object, kind, hook) or None."""
    if "NoneType" not in str(exc):
        return None
    for frame in reversed(_frames(exc.__traceback__)):
        for receiver in ("self", "method"):  # a hook of the method's, or the client template (core.template)
            me = frame.f_locals.get(receiver)
            owner = next(((obj, kind) for obj, kind in within if me is obj), None)
            hook = None if owner is None else _none_from(frame, receiver)
            if hook is not None:
                return owner[0], owner[1], hook
    return None


def _none_from(frame: Any, receiver: str = "self") -> str | None:
    """The hook ``frame``'s failing statement got a None from (see :func:`_returned_none`), or None."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(frame.f_code)))
    except (OSError, TypeError, SyntaxError):
        return None
    line = frame.f_lineno - frame.f_code.co_firstlineno + 1
    stmts = [n for n in ast.walk(tree) if isinstance(n, ast.stmt) and n.lineno <= line <= (n.end_lineno or n.lineno)
             and not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.If, ast.For, ast.While, ast.With,
                                    ast.Try))]
    if not stmts:
        return None
    failing = max(stmts, key=lambda n: n.lineno)
    nones = {n.id for n in ast.walk(failing) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
             and n.id in frame.f_locals and frame.f_locals[n.id] is None}
    made = [(node.lineno, _self_call(node.value, receiver)) for node in ast.walk(tree)
            if isinstance(node, ast.Assign) and node.lineno < failing.lineno
            and {n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)} & nones]
    made = [m for m in made if m[1] is not None]
    return max(made)[1] if made else None


def _self_call(value: ast.expr, receiver: str = "self") -> str | None:
    """``hook`` for ``self.hook(...)`` or ``yield from self.hook(...)`` (``receiver`` in place of ``self``), else
    None."""
    call = value.value if isinstance(value, (ast.YieldFrom, ast.Await)) else value
    if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and isinstance(call.func.value, ast.Name) \
            and call.func.value.id == receiver:
        return call.func.attr
    return None


def _hooks(cls: type) -> set[str]:
    """The function names ``cls``'s fedblend and torch base classes define (the hooks fedblend calls)."""
    return {n for c in cls.__mro__ if c.__module__.split(".")[0] in ("fedblend", "torch") for n in vars(c)}


def _library_dirs() -> tuple[str, ...]:
    dirs = {sysconfig.get_paths()["stdlib"]}
    for mod in ("torch", "numpy"):
        m = sys.modules.get(mod)
        if m is not None and getattr(m, "__file__", None):
            dirs.add(str(Path(m.__file__).resolve().parent))
    return tuple(dirs)


def _location(tb: TracebackType | None) -> str:
    """``file:line in function`` of the innermost frame outside torch, numpy and the standard library (the user's
    code, or fedblend's own where a built-in method raised)."""
    libs = _library_dirs()
    for frame in reversed(_frames(tb)):
        path = frame.f_code.co_filename
        if path.startswith("<") or str(Path(path).resolve()).startswith(libs):
            continue
        return f"{_short(path)}:{frame.f_lineno} in {frame.f_code.co_name}"
    return ""


def _short(path: str) -> str:
    """``path`` relative to fedblend's package or the working directory where it is under one."""
    p = Path(path).resolve()
    for base in (Path(_FEDBLEND).parent, Path.cwd()):
        try:
            return str(p.relative_to(base))
        except ValueError:
            continue
    return str(p)


def _first_line(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    text = lines[0] if lines else ""
    return text if len(text) <= 300 else text[:297] + "..."


def returned_wrong(owner: Any, kind: str, hook: str, problem: str, rnd: int | None = None, cid: Any = None,
                   verb: str = "returned"):
    """Raise the :class:`HookError` of ``owner``'s ``hook`` returning what it must not: ``"<plug-in>: <hook>
    returned <problem> (<where>)"`` (``verb``: ``"is"`` for an attribute)."""
    who = plugin_name(owner, kind)
    raise HookError(f"{who}: {hook} {verb} {problem} ({where_text(rnd, cid)}); a fault of its code", who, hook,
                    None if rnd is None else rnd + 1, cid)
