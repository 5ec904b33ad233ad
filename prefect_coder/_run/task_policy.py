"""How our tasks are made: from one configuration (:class:`~prefect_coder.settings.TaskSettings`),
retried only on what is transient; and the two that launch runs, never retried."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.client.schemas.objects import State, TaskRun
from prefect.context import TaskRunContext
from prefect.tasks import Task, TaskRunNameValueOrCallable
from prefect.utilities.annotations import NotSet

from coder_chat import is_retryable
from prefect_coder.settings import TaskSettings

T = TypeVar("T")
P = ParamSpec("P")
R = TypeVar("R")


async def retry_if_transient(task: Task[..., Any], task_run: TaskRun, state: State[Any]) -> bool:
    """Prefect's retry condition: retry only what :func:`is_retryable` calls transient."""
    try:
        await state.aresult()
    except Exception as exc:  # noqa: BLE001 - judged, not swallowed: the state stays failed
        return is_retryable(exc)
    return False


#: What every task is built with; a workflow's own settings are applied with ``with_options``.
DEFAULT_TASK_SETTINGS = TaskSettings()


def durable_task(
    *,
    name: str,
    task_run_name: TaskRunNameValueOrCallable,
    cache_key_fn: Callable[[TaskRunContext, dict[str, Any]], str] | None = None,
) -> Callable[[Callable[P, R]], Task[P, R]]:
    """Every task of ours that touches the store or Coder: retried as
    :data:`DEFAULT_TASK_SETTINGS` say, on what :func:`is_retryable` calls transient. With
    ``cache_key_fn`` its result is persisted (JSON) under that key; without it nothing is
    cached, so Prefect never hashes a task's inputs."""
    cached = cache_key_fn is not None
    return task(
        name=name,
        task_run_name=task_run_name,
        **DEFAULT_TASK_SETTINGS.task_options(),
        retry_condition_fn=retry_if_transient,
        cache_key_fn=cache_key_fn,
        cache_policy=NotSet if cached else NO_CACHE,
        persist_result=True if cached else None,
        result_serializer="json" if cached else None,
    )


def launch_task(
    *, name: str, task_run_name: TaskRunNameValueOrCallable
) -> Callable[[Callable[P, R]], Task[P, R]]:
    """A task that launches flow runs (the sweep's relaunches): never retried. A launch
    whose answer was lost on the way back may have made its run; a retry would make a
    second one. A pass that failed is covered by the next pass of the sweep, which finds
    the runs the failed one made by their tags."""
    return task(name=name, task_run_name=task_run_name, retries=0, cache_policy=NO_CACHE)


def tuned(task: Task[P, R], settings: TaskSettings) -> Task[P, R]:
    """``task`` retried as ``settings`` say (the task itself when they are the defaults)."""
    if settings == DEFAULT_TASK_SETTINGS:
        return task
    return task.with_options(**settings.task_options())
