"""The reference's seal: the reference is timed in the process the candidate ran in (worker side).

The reference is timed in the process the candidate ran in (a first baseline, and a launch-bound
reference again beside every candidate), so a candidate could slow it down to make a speedup:
replace `Model.forward` or a function of the problem's module, set `forward` on the instance, or
hook the reference's modules. It could as well shrink the problem's sizes, which `get_inputs` reads
at call time, or widen its `ATOL`. `ReferenceSeal.changes` lists any of that before timing.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import torch

_FORWARD_HOOKS = ("_global_forward_pre_hooks", "_global_forward_hooks")


def _code_attrs(namespace: dict[str, Any]) -> dict[str, Any]:
    """The functions, classes, modules and descriptors of a namespace: what would change a call's speed."""
    return {k: v for k, v in namespace.items()
            if k != "__dict__" and (callable(v) or isinstance(v, (ModuleType, property, staticmethod, classmethod)))}


_IMMUTABLE = (int, float, complex, str, bytes, bool, type(None), tuple, frozenset)


def _data_attrs(namespace: dict[str, Any]) -> dict[str, Any]:
    """The problem module's immutable module-level values: its sizes (`batch_size`, `BATCH`), which
    `get_inputs` reads at call time, and its `ATOL`/`RTOL`. Mutable containers are left out: a
    problem's own code may keep a cache in one."""
    return {k: v for k, v in namespace.items() if not k.startswith("__") and isinstance(v, _IMMUTABLE)}


def _data_change(before: object, namespace: dict[str, Any], name: str) -> str | None:
    """How the value `name` had at the seal changed, or None. A None that became an object is a
    problem's own lazy set-up (`_kernel = None`, compiled on the first forward), not a change."""
    if name not in namespace:
        return "removed"
    now = namespace[name]
    if now is before or (type(now) is type(before) and now == before):
        return None
    if before is None and not isinstance(now, _IMMUTABLE):
        return None
    return f"changed from {before!r} to {now!r}"


def _data_diff(before: dict[str, Any], namespace: dict[str, Any]) -> list[str]:
    changed = [(k, _data_change(v, namespace, k)) for k, v in before.items()]
    added = [k for k in _data_attrs(namespace) if k not in before]
    return [f"problem module: {k} {what}"[:200] for k, what in changed if what] + [
        f"problem module: {k} added"[:200] for k in added
    ]


def _instance_state(ref: torch.nn.Module) -> dict[str, tuple[type, dict[str, Any], tuple[int, ...]]]:
    """Per submodule of `ref`: its class, the callables set on the instance (a replaced `forward`)
    and its forward hook ids."""
    out = {}
    for name, m in ref.named_modules():
        own = {k: v for k, v in vars(m).items() if callable(v) and not isinstance(v, (torch.nn.Module, torch.Tensor))}
        out[name] = (type(m), own, tuple(m._forward_pre_hooks) + tuple(m._forward_hooks))
    return out


def _global_hooks() -> set[int]:
    mod = sys.modules["torch.nn.modules.module"]
    return {k for name in _FORWARD_HOOKS for k in getattr(mod, name, {})}


def _diff(where: str, before: dict[str, Any], now: dict[str, Any]) -> list[str]:
    changed = [k for k in before if k not in now or now[k] is not before[k]]
    added = [k for k in now if k not in before]
    return [f"{where}{k} {'replaced' if k in now else 'removed'}" for k in changed] + [
        f"{where}{k} added" for k in added
    ]


@dataclass
class ReferenceSeal:
    """What the reference's speed depends on in Python, captured before the candidate could touch it.

    The reference is timed in the process the candidate ran in (a first baseline, and a
    launch-bound reference again beside every candidate), so a candidate could slow it down to
    make a speedup: replace `Model.forward` or a function of the problem's module, set `forward`
    on the instance, or hook the reference's modules. `changes` lists any of that before timing.
    Taken in two steps: the problem's module and the global forward hooks right after the problem
    is imported (before the candidate's import), the reference instance right after it is built
    (before ModelNew's constructor runs).
    """

    module: dict[str, Any]
    classes: dict[str, dict[str, Any]]
    hooks: set[int]
    instances: dict[str, tuple[type, dict[str, Any], tuple[int, ...]]] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)  # the module's sizes and tolerances (`_data_attrs`)

    @classmethod
    def of_problem(cls, pmod: ModuleType) -> ReferenceSeal:
        """The problem module's code, sizes and tolerances, its classes' attributes, and the global
        forward hooks."""
        module = _code_attrs(vars(pmod))
        classes = {
            k: _code_attrs(dict(vars(v)))
            for k, v in module.items()
            if isinstance(v, type) and v.__module__ == pmod.__name__
        }
        return cls(module=module, classes=classes, hooks=_global_hooks(), data=_data_attrs(vars(pmod)))

    def seal_instance(self, ref: torch.nn.Module) -> None:
        """Adds the reference instance (and its submodules) as built."""
        self.instances = _instance_state(ref)

    def changes(self, pmod: ModuleType, ref: torch.nn.Module) -> list[str]:
        """What changed since the seal was taken (empty: the reference is as the problem defines it).

        A lazy module becoming its `cls_to_become`, or dropping the hook that did it, is not a
        change; only added hooks count."""
        found = _diff("problem module: ", self.module, _code_attrs(vars(pmod)))
        found += _data_diff(self.data, vars(pmod))
        for name, attrs in self.classes.items():
            klass = self.module[name]
            found += _diff(f"{name}.", attrs, _code_attrs(dict(vars(klass))))
        if _global_hooks() - self.hooks:
            found.append("a global forward hook added (torch.nn.modules.module)")
        now = _instance_state(ref)
        for name, (klass, own, hooks) in self.instances.items():
            label = f"Model.{name}" if name else "the Model instance"
            if name not in now:
                found.append(f"{label} removed")
                continue
            klass_now, own_now, hooks_now = now[name]
            if klass_now is not klass and getattr(klass, "cls_to_become", None) is not klass_now:
                found.append(f"{label}: class changed to {klass_now.__qualname__}")
            found += _diff(f"{label}: ", own, own_now)
            if set(hooks_now) - set(hooks):
                found.append(f"{label}: forward hook added")
        found += [f"Model.{name} added" for name in now if name not in self.instances]
        return found
