"""The registry of `rules` tasks: task name -> function from a request's context to its JSON answer."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["TASKS", "Task", "rule"]

#: one rule: a request's context -> a JSON-serializable answer that satisfies the request's schema
Task = Callable[[dict[str, Any]], dict[str, Any]]

#: task name -> function(context) -> JSON-serializable answer that satisfies the request's schema
TASKS: dict[str, Task] = {}


def rule(task: str) -> Callable[[Task], Task]:
    """Register the rule that answers `task`."""
    def deco(fn: Task) -> Task:
        TASKS[task] = fn
        return fn
    return deco
