"""The grader's code that runs inside each learner's kernel, part 1: the state the notebook may change.

Sent as text, never imported in the kernel: ``runner.kernel_source()`` joins this file and
``kernel_recheck.py`` (the re-check) and the kernel executes them in one namespace of the grader's own.

``snapshot()`` runs before the learner's first cell. It imports ``course_lib.checks`` (every
checker's reference module with it) and keeps the original state of builtins, torch's public modules,
nn.Module and every course_lib module (attributes, functions' code, defaults and closures, classes'
attributes, lists and dicts), the import machinery and the way a result leaves the kernel;
``restore()`` puts back what the notebook changed and says what. ``restorer``, ``course_files``,
``is_ours`` and ``functions_of`` are the re-check's too (kernel_recheck.py).
"""

import sys

MIME = "application/vnd.course-grader+json"


# The import machinery and the way a result leaves the kernel: every callable, private ones too.
_DEEP = ("importlib", "importlib._bootstrap", "importlib._bootstrap_external", "_frozen_importlib",
         "_frozen_importlib_external", "ipykernel.zmqshell", "ipykernel.jsonutil", "ipykernel.iostream",
         "jupyter_client.session", "jupyter_client.jsonutil", "IPython.core.display_functions",
         "IPython.display", "zmq.sugar.socket")


def _deep(name):
    """Whether every callable of module ``name`` and its classes is guarded, private ones too:
    ``_DEEP`` and torch's public modules (red team of 2026-12-07: ``torch.autograd.backward``)."""
    return name in _DEEP or name == "torch" or (
        name.startswith("torch.") and not any(p.startswith("_") for p in name.split(".")[1:]))


def _watched(target):
    """The attributes of ``target`` that restore() guards: public names, Tensor's operators, and
    every callable of the import machinery and of the display path (``_DEEP``)."""
    import types

    names = vars(target)
    name = getattr(target, "__name__", None)
    module = name if isinstance(target, types.ModuleType) else str(names.get("__module__", ""))
    every = {k: v for k, v in names.items() if k not in ("__dict__", "__weakref__", "__doc__")
             and (callable(v) or isinstance(v, (classmethod, staticmethod, property)))} \
        if isinstance(target, (types.ModuleType, type)) and _deep(module) else {}
    if name == "Tensor":
        return {**{k: v for k, v in names.items() if not k.startswith("_") or k.endswith("__")}, **every}
    if name == "builtins":  # ipykernel swaps input() per request itself
        return {k: v for k, v in names.items() if (not k.startswith("_") and k != "input")
                or k in ("__import__", "__build_class__")}
    if module in _DEEP or (every and isinstance(target, type)):  # not a class's counters
        return every  # (RemovableHandle.next_id counts hooks)
    return {**{k: v for k, v in names.items() if not k.startswith("_")}, **every}


def is_ours(name):
    return name == "course_lib" or name.startswith("course_lib.")


def functions_of(module):
    """(owner, attribute name, function) for the functions a course_lib module defines, its classes'
    methods included."""
    import inspect

    found = []
    for name, value in list(vars(module).items()):
        if getattr(value, "__module__", None) != module.__name__:
            continue
        if inspect.isfunction(value):
            found.append((module, name, value))
        elif inspect.isclass(value):
            for attr, member in list(vars(value).items()):
                member = getattr(member, "__func__", member)
                if inspect.isfunction(member):
                    found.append((value, attr, member))
    return found


def _state(modules):
    """What restore() puts back: module attributes, functions' code and defaults, classes'
    attributes, and the contents of module-level lists, dicts and sets."""
    import inspect
    import types

    attrs = {}
    for name, module in modules.items():
        attrs[name] = {k: v for k, v in vars(module).items() if not isinstance(v, types.ModuleType)}
    functions = [(f, f.__code__, f.__defaults__, f.__kwdefaults__,
                  [c.cell_contents if _filled(c) else None for c in f.__closure__ or ()])
                 for module in modules.values() for _, _, f in functions_of(module)]
    classes = [(v, dict(vars(v))) for module in modules.values() for v in vars(module).values()
               if inspect.isclass(v) and getattr(v, "__module__", None) == module.__name__]
    containers = [(v, list(v) if isinstance(v, list) else v.copy()) for module in modules.values()
                  for k, v in vars(module).items() if type(v) in (list, dict, set)
                  and k not in ("RESULTS", "_PASSED", "__all__")]
    return attrs, functions, classes, containers


def _filled(cell):
    try:
        cell.cell_contents  # noqa: B018
        return True
    except ValueError:
        return False


def restorer(modules):
    """restore() for ``modules``: puts back what the notebook changed in them; returns what."""
    attrs, functions, classes, containers = _state(modules)
    missing = object()

    def restore(containers_too=True):
        """``containers_too``: count a changed list or dict as a change (a cache that a checker
        fills while it runs is put back silently when False)."""
        changed = []
        for name, module in modules.items():
            if sys.modules.get(name) is not module:
                sys.modules[name] = module
                changed.append(f"sys.modules[{name!r}]")
            now = vars(module)
            for key, value in attrs[name].items():
                if now.get(key, missing) is not value:
                    now[key] = value
                    changed.append(f"{name}.{key}")
        for f, code, defaults, kwdefaults, cells in functions:
            if f.__code__ is not code or f.__defaults__ is not defaults or f.__kwdefaults__ is not kwdefaults:
                f.__code__, f.__defaults__, f.__kwdefaults__ = code, defaults, kwdefaults
                changed.append(f"{f.__module__}.{f.__qualname__}")
            for cell, value in zip(f.__closure__ or (), cells):
                if _filled(cell) and cell.cell_contents is not value:
                    cell.cell_contents = value
                    changed.append(f"{f.__module__}.{f.__qualname__} (its closure)")
        for cls, members in classes:
            now = dict(vars(cls))
            for key in set(now) | set(members):
                if key in ("__dict__", "__weakref__", "__doc__", "__abstractmethods__"):
                    continue
                if now.get(key, missing) is not members.get(key, missing):
                    try:
                        if key in members:
                            setattr(cls, key, members[key])
                        else:
                            delattr(cls, key)
                    except (AttributeError, TypeError):
                        pass
                    changed.append(f"{cls.__module__}.{cls.__qualname__}.{key}")
        for container, contents in containers:
            if (list(container) if isinstance(container, list) else container) != contents:
                if isinstance(container, list):
                    container[:] = contents
                else:
                    container.clear()
                    container.update(contents)
                if containers_too:
                    changed.append(f"a list or dict of course_lib ({type(container).__name__})")
        return changed

    return restore


def snapshot():
    import builtins
    import threading

    import torch
    import torch.nn.functional as F

    import course_lib.checks  # noqa: F401 (loads every checker and the references they compare with)

    import json
    import json.encoder

    import importlib
    import os

    try:  # the way results leave: IPython's publish_display_data and, in a kernel, ipykernel's classes
        import IPython.display  # noqa: F401
        from IPython.core import display_functions

        publish_display_data = display_functions.publish_display_data
    except ImportError:
        publish_display_data = None
    for name in ("ipykernel.zmqshell", "ipykernel.jsonutil", "ipykernel.iostream", "jupyter_client.session",
                 "jupyter_client.jsonutil", "zmq.sugar.socket"):
        if name.split(".")[0] in sys.modules:
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001
                pass
    deep = [m for n, m in list(sys.modules.items()) if _deep(n) and isinstance(m, type(sys))]
    deep += [v for m in deep for v in list(vars(m).values())  # (issubclass: no lazy attribute's warning)
             if issubclass(type(v), type) and _deep(str(vars(v).get("__module__", "")))]
    targets = [builtins, torch, torch.Tensor, F, torch.nn.Module, json, json.encoder, json.JSONEncoder]
    saved = [(t, dict(_watched(t))) for t in {id(t): t for t in targets + deep}.values()]
    torch_dir = os.path.dirname(torch.__file__) + os.sep
    held, held_types = _sending_objects()
    hooks = [list(h) for h in _display_hooks()]
    finders, path_hooks = list(sys.meta_path), list(sys.path_hooks)
    modules = {n: m for n, m in sys.modules.items() if is_ours(n) and not n.startswith("course_lib.checks")}
    ours = restorer(modules)
    missing = object()
    kernel_threads = set(sys._current_frames()) | {t.ident for t in threading.enumerate()}

    first, depth = dict(_watched(builtins)), sys.getrecursionlimit()

    def put_back_first():
        """Builtins and the recursion limit first, by dict methods only (red team of 2026-12-07)."""
        now = vars(builtins)
        changed = [f"builtins.{k}" for k, v in first.items() if now.get(k, missing) is not v]
        now.update(first)
        if sys.getrecursionlimit() != depth:
            sys.setrecursionlimit(depth)
            changed.append("sys.setrecursionlimit")
        return changed

    def restore(containers_too=True):
        changed = put_back_first()
        # the import machinery: the finders there were come first again, in their order (one the
        # notebook added goes after them, where it can no longer serve course_lib); caches are dropped
        for name, now, before in (("sys.meta_path", sys.meta_path, finders), ("sys.path_hooks", sys.path_hooks,
                                                                               path_hooks)):
            added = [f for f in now if not any(f is b for b in before)]
            if len(now) < len(before) or any(a is not b for a, b in zip(now, before)):
                now[:] = before + added
                changed.append(name)
        if sys.meta_path is not finders:
            sys.meta_path = finders
            changed.append("sys.meta_path")
        if sys.path_hooks is not path_hooks:
            sys.path_hooks = path_hooks
            changed.append("sys.path_hooks")
        for d, kept in held:
            for key, value in kept.items():
                if d.get(key, missing) is not value:
                    d[key] = value
                    changed.append(f"the kernel's display path ({key})")
            for key in [k for k, v in d.items() if callable(v) and k not in kept]:  # a method shadowed
                del d[key]
                changed.append(f"the kernel's display path ({key})")
        for obj, kind in held_types:
            if type(obj) is not kind:
                try:
                    obj.__class__ = kind
                except TypeError:
                    pass
                changed.append(f"the kernel's display path ({kind.__name__})")
        for now, before in zip(_display_hooks(), hooks):
            if len(now) != len(before) or any(a is not b for a, b in zip(now, before)):
                now[:] = before
                changed.append("the kernel's display hooks")
        for target, attrs_ in saved:
            now = vars(target)
            for name, value in attrs_.items():
                new = now.get(name, missing)
                if new is not value and _torch_own(new, value, torch_dir):
                    continue  # torch's own wrapper (importing torch._dynamo wraps torch.manual_seed)
                if new is not value:
                    try:
                        setattr(target, name, value)
                    except (AttributeError, TypeError):
                        pass
                    changed.append(f"{getattr(target, '__name__', '?')}.{name}")
        return changed + ours(containers_too)

    restore.kernel_threads, restore.first, restore.files = kernel_threads, put_back_first, course_files()
    restore.publish_display_data = publish_display_data  # the function as it was before any cell ran
    return restore


def course_files():
    """(file, size, time) of course_lib's checkers and solutions (red team of 2026-12-07)."""
    import os
    import course_lib
    root = os.path.dirname(os.path.abspath(course_lib.__file__))
    return sorted((p, st.st_size, st.st_mtime_ns) for sub in ("checks", "solutions") for d, _, names in
                  os.walk(os.path.join(root, sub)) for n in names if n.endswith(".py")
                  for p in [os.path.join(d, n)] for st in [os.stat(p)])


def _torch_own(new, old, torch_dir):
    """``new`` replaces ``old`` with code from torch's files: its wrapper, or torch._dynamo's patch
    (``functools.wraps`` in a cell copies ``__wrapped__`` and ``__module__``, not the file)."""
    file = getattr(getattr(new, "__code__", None), "co_filename", "")
    return file.startswith(torch_dir) and (getattr(new, "__wrapped__", None) is old or "_dynamo" in file)


def _sending_objects():
    """([(dict, {key: value})], [(object, its class)]) for ``_senders``: their own callables, sockets,
    session and thread (some in traitlets' ``_trait_values``), and their classes (``__class__``)."""
    found, objects = [], _senders()
    for obj in objects:
        for d in (vars(obj), vars(obj).get("_trait_values")):
            if isinstance(d, dict):
                found.append((d, {k: v for k, v in d.items() if callable(v) or k in (
                    "session", "pub_socket", "pack", "unpack", "auth", "digest_mod", "_thread_local",
                    "io_thread", "socket", "_events", "io_loop", "thread")}))
    return found, [(o, type(o)) for o in objects]


def _senders():
    """The display publisher, its session and socket, the IOPub thread and its zmq socket."""
    try:
        from IPython import get_ipython
    except ImportError:
        return []
    pub = getattr(get_ipython(), "display_pub", None)
    sock, thread = getattr(pub, "pub_socket", None), getattr(getattr(pub, "pub_socket", None), "io_thread", None)
    objects = (pub, getattr(pub, "session", None), sock, thread, getattr(thread, "socket", None))
    return [o for o in objects if o is not None and isinstance(getattr(o, "__dict__", None), dict)]


def _display_hooks():
    """The lists of display hooks (``display_pub.register_hook``) this thread's messages pass
    through: a hook could rewrite a result. Empty outside a kernel."""
    try:
        from IPython import get_ipython

        pub = getattr(get_ipython(), "display_pub", None)
        hooks = getattr(pub, "_hooks", None)
    except Exception:  # noqa: BLE001
        return []
    return [hooks] if isinstance(hooks, list) else []
