"""The task registry: the one place that maps a task's name to its `Task` object, and the
task a config trains."""

from __future__ import annotations

from typing import Any

from jaxformer import models, run_settings
from jaxformer.tasks.base import Task

_TASKS: dict[str, Task] = {}


def register(task: Task, *, replace: bool = False) -> Task:
  """Add `task` under its name (a test or plugin can add its own)."""
  if not isinstance(task, Task):
    raise TypeError(f"register() takes a tasks.Task; got {type(task).__name__}")
  if not isinstance(task.name, str) or not task.name.isidentifier():
    raise ValueError(f"task name {task.name!r} must be an identifier")
  if task.name in _TASKS and not replace:
    raise ValueError(f"task {task.name!r} is already registered (replace=True to override it)")
  _TASKS[task.name] = task
  return task


def unregister(name: str):
  _TASKS.pop(name, None)


def get(name: Any) -> Task:
  """The task registered as `name`; a ValueError listing the known tasks otherwise."""
  if name not in _TASKS:
    raise ValueError(f"task {name!r} is not one of {sorted(_TASKS)}")
  return _TASKS[name]


def names() -> tuple[str, ...]:
  return tuple(_TASKS)


def task_for(model_config) -> Task:
  """The task the model family of `model_config` trains (its registry entry's `task`, in the
  variant the model config asks for: `Task.for_model`)."""
  family = models.get(model_config.get("family"))
  if family.task not in _TASKS:
    raise ValueError(f"model family {family.name!r} names task {family.task!r}, which is not "
                     f"one of the registered tasks {sorted(_TASKS)}")
  return _TASKS[family.task].for_model(model_config)


def task_for_run(config, settings: run_settings.RunSettings | None = None) -> Task:
  """The task of a training config: `posttrain.method` where its settings (`run_settings.parse`
  of `config` unless given) have a posttrain section, else the model family's (`task_for`)."""
  settings = settings or run_settings.parse(config)
  post = settings.posttrain
  task = task_for(settings.model)
  if post is None:
    return task
  if task.name != "lm":
    raise ValueError(f"posttrain.method={post.method!r} needs a decoder LM; "
                     f"model.family={settings.model.family!r} trains task {task.name!r}")
  if post.method not in _TASKS:
    raise ValueError(f"posttrain.method={post.method!r} has no task")
  return _TASKS[post.method].for_posttrain(post)


def saved_run_data(config):
  """The typed data settings of a saved run's config (its config.json): the settings of its
  task's kind of source (`jaxformer.data.settings`), read as the run wrote them: a key this
  version does not know is ignored (`strict=False`), every key it knows is checked."""
  from jaxformer.data import settings as source_settings
  kind = task_for_run(config, run_settings.parse(config)).data_kind
  return source_settings.parse(kind, config, strict=False)
