"""``ChatClient``: every REST endpoint of Coder's chat API, over one ``httpx.AsyncClient``.

Routes are tried under ``/api/v2/chats`` first; a 404 is retried once under
``/api/experimental/chats``, and the first non-404 answer locks the prefix for
this client. Every non-2xx answer becomes :class:`~coder_chat.errors.CoderApiError`
and every network failure :class:`~coder_chat.errors.CoderTransportError`.

Only reads are ever retried here. A create, a send or a tool-results submission
is never retried by the client, since a retry could run a turn twice; that
decision belongs to the caller (the durable layer).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, Literal, TypeVar

import httpx
from pydantic import BaseModel, TypeAdapter, ValidationError

from ..errors import CoderApiError, CoderConfigError, CoderTransportError, CoderUsageLimitError
from ..protocol.models import (
    CHATS,
    MODEL_CONFIGS,
    Chat,
    ChatMessage,
    DynamicTool,
    MessagesPage,
    ModelConfig,
    SendMessageResponse,
    UploadedFile,
)
from ..protocol.retry import backoff, is_retryable
from .events import Emitter, HttpError, HttpRequest, HttpResponse, TransportCallback

V2 = "/api/v2/chats"
EXPERIMENTAL = "/api/experimental/chats"
TOKEN_HEADER = "Coder-Session-Token"

M = TypeVar("M", bound=BaseModel)
InputPart = Mapping[str, Any]
Content = str | Sequence[InputPart]


def text_content(content: Content) -> list[dict[str, Any]]:
    """Input parts from a string (one text part) or a sequence of parts."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [dict(part) for part in content]


#: Requests one client has on the wire at once; the rest wait their turn here. httpcore
#: keeps at most 20 idle connections (closing any idle one while it holds more) and, for
#: every request it queues, scans every connection: beyond 20 at once, a fleet of chats
#: dials anew for most requests and pays work that grows with the square of the queue.
MAX_IN_FLIGHT = 20


class ChatClient:
    """Async client for the chat REST API. Use it as ``async with ChatClient(...)``."""

    def __init__(
        self,
        *,
        base_url: str,
        token: str,
        timeout: float = 30.0,
        read_retries: int = 2,
        retry_delay: float = 0.5,
        on_transport_event: TransportCallback | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        max_in_flight: int = MAX_IN_FLIGHT,
    ) -> None:
        if not base_url:
            raise CoderConfigError("base_url is required")
        if not token:
            raise CoderConfigError("token is required")
        self.base_url = base_url.rstrip("/")
        self.emit = Emitter(on_transport_event)
        self._token = token
        self._read_retries = read_retries
        self._retry_delay = retry_delay
        self._prefix: str | None = None
        self._http = httpx.AsyncClient(
            base_url=self.base_url,
            headers={TOKEN_HEADER: token},
            timeout=timeout,
            transport=transport,
        )
        self._in_flight = asyncio.Semaphore(max(1, max_in_flight))

    def __repr__(self) -> str:
        return f"ChatClient(base_url={self.base_url!r})"

    async def __aenter__(self) -> ChatClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    @property
    def closed(self) -> bool:
        """Whether :meth:`aclose` was called."""
        return self._http.is_closed

    @property
    def auth_headers(self) -> dict[str, str]:
        """Headers for a WebSocket upgrade (the token goes in a header, never the URL)."""
        return {TOKEN_HEADER: self._token}

    # -- chats ---------------------------------------------------------------
    async def list_chats(
        self,
        *,
        labels: Mapping[str, str] | None = None,
        archived: bool = False,
        limit: int | None = None,
        offset: int | None = None,
        after_id: str | None = None,
    ) -> list[Chat]:
        """One page of the caller's chats, newest first; label filters are ANDed."""
        params: list[tuple[str, str]] = [("label", f"{k}:{v}") for k, v in (labels or {}).items()]
        if archived:
            params.append(("q", "archived:true"))
        for key, value in (("limit", limit), ("offset", offset), ("after_id", after_id)):
            if value is not None:
                params.append((key, str(value)))
        response = await self._request("list_chats", "GET", "", params=params)
        return _parse(CHATS, response)

    async def iter_chats(
        self,
        *,
        labels: Mapping[str, str] | None = None,
        archived: bool = False,
        page_size: int = 200,
    ) -> AsyncIterator[Chat]:
        """Every matching chat, page by page (keyset cursor on the last chat's id)."""
        after: str | None = None
        while True:
            page = await self.list_chats(
                labels=labels, archived=archived, limit=page_size, after_id=after
            )
            for chat in page:
                yield chat
            if len(page) < page_size:
                return
            after = page[-1].id

    async def create_chat(
        self,
        *,
        organization_id: str,
        content: Content,
        system_prompt: str | None = None,
        workspace_id: str | None = None,
        model_config_id: str | None = None,
        mcp_server_ids: Sequence[str] | None = None,
        labels: Mapping[str, str] | None = None,
        tools: Sequence[DynamicTool] = (),
        plan_mode: Literal["", "plan"] | None = None,
    ) -> Chat:
        """Create a chat and start its first turn. Never retried (a retry is a second chat)."""
        body: dict[str, Any] = {
            "organization_id": organization_id,
            "content": text_content(content),
            "client_type": "api",
        }
        optional = {
            "system_prompt": system_prompt,
            "workspace_id": workspace_id,
            "model_config_id": model_config_id,
            "mcp_server_ids": list(mcp_server_ids) if mcp_server_ids else None,
            "labels": dict(labels) if labels else None,
            "plan_mode": plan_mode,
        }
        body.update({k: v for k, v in optional.items() if v is not None})
        if tools:
            body["unsafe_dynamic_tools"] = [t.model_dump() for t in tools]
        response = await self._request("create_chat", "POST", "", json=body)
        return _parse_model(Chat, response)

    async def get_chat(self, chat_id: str) -> Chat:
        response = await self._request("get_chat", "GET", f"/{chat_id}")
        return _parse_model(Chat, response)

    async def update_chat(
        self,
        chat_id: str,
        *,
        title: str | None = None,
        archived: bool | None = None,
        labels: Mapping[str, str] | None = None,
        workspace_id: str | None = None,
    ) -> None:
        body: dict[str, Any] = {}
        if title is not None:
            body["title"] = title
        if archived is not None:
            body["archived"] = archived
        if labels is not None:
            body["labels"] = dict(labels)
        if workspace_id is not None:
            body["workspace_id"] = workspace_id
        await self._request("update_chat", "PATCH", f"/{chat_id}", json=body)

    async def archive_chat(self, chat_id: str) -> None:
        """``PATCH {"archived": true}`` once; see :meth:`ChatSession.archive` for the 409 retry."""
        await self.update_chat(chat_id, archived=True)

    # -- messages ------------------------------------------------------------------
    async def get_messages(
        self,
        chat_id: str,
        *,
        before_id: int | None = None,
        after_id: int | None = None,
        limit: int | None = None,
    ) -> MessagesPage:
        """One page: newest first, or oldest first when only ``after_id`` is given."""
        params = {
            k: str(v)
            for k, v in (("before_id", before_id), ("after_id", after_id), ("limit", limit))
            if v is not None
        }
        response = await self._request("get_messages", "GET", f"/{chat_id}/messages", params=params)
        return _parse_model(MessagesPage, response)

    async def iter_messages(
        self, chat_id: str, *, page_size: int = 200
    ) -> AsyncIterator[ChatMessage]:
        """Every committed message, newest first, paging with ``before_id``."""
        before: int | None = None
        while True:
            page = await self.get_messages(chat_id, before_id=before, limit=page_size)
            for message in page.messages:
                yield message
            if not page.has_more or not page.messages:
                return
            before = min(m.id for m in page.messages)

    async def send_message(
        self,
        chat_id: str,
        content: Content,
        *,
        busy_behavior: Literal["queue", "interrupt"] = "queue",
        model_config_id: str | None = None,
        mcp_server_ids: Sequence[str] | None = None,
    ) -> SendMessageResponse:
        """Send a prompt: admitted at once, or queued behind a live run. Never retried."""
        body: dict[str, Any] = {"content": text_content(content), "busy_behavior": busy_behavior}
        if model_config_id:
            body["model_config_id"] = model_config_id
        if mcp_server_ids is not None:
            body["mcp_server_ids"] = list(mcp_server_ids)
        response = await self._request("send_message", "POST", f"/{chat_id}/messages", json=body)
        return _parse_model(SendMessageResponse, response)

    async def delete_queued_message(self, chat_id: str, queued_id: int) -> None:
        await self._request("delete_queued_message", "DELETE", f"/{chat_id}/queue/{queued_id}")

    async def promote_queued_message(self, chat_id: str, queued_id: int) -> None:
        """Move a queued prompt to the queue head (an idle chat runs it at once). Never retried."""
        await self._request(
            "promote_queued_message", "POST", f"/{chat_id}/queue/{queued_id}/promote"
        )

    async def submit_tool_results(self, chat_id: str, results: Sequence[Mapping[str, Any]]) -> None:
        """Answer every pending client-tool call in one request. Never retried."""
        body = {"results": [dict(r) for r in results]}
        await self._request("submit_tool_results", "POST", f"/{chat_id}/tool-results", json=body)

    async def interrupt_chat(self, chat_id: str) -> Chat:
        """Ask the run to stop; answers at once (usually ``interrupting``); 409 when idle."""
        response = await self._request("interrupt_chat", "POST", f"/{chat_id}/interrupt")
        return _parse_model(Chat, response)

    # -- files and models -----------------------------------------------------------
    async def upload_file(
        self, *, organization_id: str, data: bytes, media_type: str, filename: str | None = None
    ) -> str:
        headers = {"Content-Type": media_type}
        if filename:
            headers["Content-Disposition"] = f'attachment; filename="{filename}"'
        response = await self._request(
            "upload_file",
            "POST",
            "/files",
            params={"organization": organization_id},
            content=data,
            headers=headers,
        )
        return _parse_model(UploadedFile, response).id

    async def download_file(self, file_id: str) -> tuple[bytes, str]:
        """An attachment's bytes and its stored media type."""
        response = await self._request("download_file", "GET", f"/files/{file_id}")
        media_type = response.headers.get("content-type", "application/octet-stream")
        return response.content, media_type.split(";")[0].strip()

    async def model_configs(self, *, organization_id: str | None = None) -> list[ModelConfig]:
        """Model configs: the org-scoped listing first, the legacy route on 404."""
        if organization_id:
            path = f"/api/v2/organizations/{organization_id}/chats/models"
            try:
                response = await self._send("model_configs", "GET", path, {})
                models = response.json().get("models", [])
                return MODEL_CONFIGS.validate_python(models)
            except CoderApiError as exc:
                if exc.status != 404:
                    raise
        response = await self._send("model_configs", "GET", f"{EXPERIMENTAL}/model-configs", {})
        return _parse(MODEL_CONFIGS, response)

    # -- plumbing ------------------------------------------------------------------------
    async def resolve_prefix(self) -> str:
        """The chat route prefix, probing with a chat listing if not yet known."""
        if self._prefix is None:
            await self._request("probe", "GET", "", params={"limit": "1"})
        return self._prefix or V2

    def ws_url(self, path: str) -> str:
        return self.base_url.replace("https://", "wss://", 1).replace("http://", "ws://", 1) + path

    async def _request(self, op: str, method: str, suffix: str, **kwargs: Any) -> httpx.Response:
        """Send with prefix negotiation; retry reads on transient failures."""
        attempts = self._read_retries + 1 if method == "GET" else 1
        delays = backoff(self._retry_delay)
        for attempt in range(attempts):
            try:
                return await self._negotiated(op, method, suffix, kwargs)
            except (CoderApiError, CoderTransportError) as exc:
                if attempt + 1 >= attempts or not is_retryable(exc):
                    raise
            await asyncio.sleep(next(delays))
        raise AssertionError("unreachable")

    async def _negotiated(
        self, op: str, method: str, suffix: str, kwargs: dict[str, Any]
    ) -> httpx.Response:
        if self._prefix is not None:
            return await self._send(op, method, self._prefix + suffix, kwargs)
        try:
            response = await self._send(op, method, V2 + suffix, kwargs)
        except CoderApiError as v2_error:
            if v2_error.status != 404:
                self._prefix = V2
                raise
            try:
                response = await self._send(op, method, EXPERIMENTAL + suffix, kwargs)
            except CoderApiError as exc:
                if exc.status == 404:
                    raise v2_error from None  # both 404: surface v2's, keep negotiating
                self._prefix = EXPERIMENTAL
                raise
            self._prefix = EXPERIMENTAL
            return response
        self._prefix = V2
        return response

    async def _send(
        self, op: str, method: str, path: str, kwargs: dict[str, Any]
    ) -> httpx.Response:
        self.emit(HttpRequest(op, method, path))
        started = time.monotonic()
        try:
            async with self._in_flight:
                response = await self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            self.emit(HttpError(op, method, path, reason, time.monotonic() - started))
            sent = not isinstance(exc, _NEVER_SENT)
            raise CoderTransportError(f"{method} {path}", reason, sent=sent) from exc
        self.emit(HttpResponse(op, method, path, response.status_code, time.monotonic() - started))
        if response.is_success:
            return response
        raise _api_error(response, method, path)


#: Failures before any byte of the request left: no connection was made.
_NEVER_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


def _api_error(response: httpx.Response, method: str, path: str) -> CoderApiError:
    message, detail = response.reason_phrase or "error", None
    try:
        body = response.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        body = None
    if isinstance(body, dict):
        message = str(body.get("message") or message)
        detail = body.get("detail") or None
        if body.get("validations"):
            problems = "; ".join(
                f"{v.get('field')}: {v.get('detail')}" for v in body["validations"]
            )
            detail = f"{detail} ({problems})" if detail else problems
        if response.status_code == 409 and "limit_micros" in body:
            return _usage_limit(body, method, path, message, detail)
    return CoderApiError(response.status_code, method, path, message, detail)


def _usage_limit(
    body: dict[str, Any], method: str, path: str, message: str, detail: str | None
) -> CoderUsageLimitError:
    """Coder's 409 past the user's usage limit, with its figures (malformed ones: None)."""

    def micros(name: str) -> int | None:
        value = body.get(name)
        return value if isinstance(value, int) else None

    try:
        resets = datetime.fromisoformat(str(body.get("resets_at")))
    except ValueError:
        resets = None
    return CoderUsageLimitError(
        409,
        method,
        path,
        message,
        detail,
        spent_micros=micros("spent_micros"),
        limit_micros=micros("limit_micros"),
        resets_at=resets,
    )


def _parse_model(model: type[M], response: httpx.Response) -> M:
    return _parsed(model.model_validate_json, response)


T = TypeVar("T")


def _parse(adapter: TypeAdapter[T], response: httpx.Response) -> T:
    return _parsed(adapter.validate_json, response)


def _parsed(validate: Callable[[bytes], T], response: httpx.Response) -> T:
    """The response body as ``validate`` reads it; a body that does not fit is the
    transport's failure, not the caller's."""
    try:
        return validate(response.content)
    except ValidationError as exc:
        raise CoderTransportError(
            f"{response.request.method} {response.request.url.path}",
            f"unexpected response body: {exc.error_count()} problem(s)",
        ) from None
