"""How our tasks are made: one configuration, retried only on what is transient."""

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
from prefect_coder._run.runtime import RETRY_DELAYS

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


def durable_task(
    *,
    name: str,
    task_run_name: TaskRunNameValueOrCallable,
    cache_key_fn: Callable[[TaskRunContext, dict[str, Any]], str] | None = None,
) -> Callable[[Callable[P, R]], Task[P, R]]:
    """Every task of ours: retried on what :func:`is_retryable` calls transient, with the
    same delays. With ``cache_key_fn`` its result is persisted (JSON) under that key;
    without it nothing is cached, so Prefect never hashes a task's inputs."""
    cached = cache_key_fn is not None
    return task(
        name=name,
        task_run_name=task_run_name,
        retries=len(RETRY_DELAYS),
        retry_delay_seconds=RETRY_DELAYS,
        retry_condition_fn=retry_if_transient,
        cache_key_fn=cache_key_fn,
        cache_policy=NotSet if cached else NO_CACHE,
        persist_result=True if cached else None,
        result_serializer="json" if cached else None,
    )
