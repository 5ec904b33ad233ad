"""``coder_chat``: a Python client for Coder's chat API, and the durable layer on top.

Imports nothing from Prefect. The public surface::

    from coder_chat import ChatClient, ChatOptions, ChatSession, TurnResult
    from coder_chat.errors import CoderApiError, CoderChatError, CoderStreamError
"""

from .client.events import TransportEvent
from .client.options import ChatOptions
from .client.rest import ChatClient
from .client.results import StepRecord, ToolCallRecord, TurnResult
from .client.session import ChatSession, SessionHooks
from .client.stream import ChatStream
from .client.tools import ClientTool, client_tool
from .errors import (
    CoderApiError,
    CoderChatError,
    CoderConfigError,
    CoderError,
    CoderStoreError,
    CoderStreamError,
    CoderTransportError,
    CoderUsageLimitError,
)
from .protocol.retry import is_retryable

__all__ = [
    "ChatClient",
    "ChatOptions",
    "ChatSession",
    "ChatStream",
    "ClientTool",
    "CoderApiError",
    "CoderChatError",
    "CoderConfigError",
    "CoderError",
    "CoderStoreError",
    "CoderStreamError",
    "CoderTransportError",
    "CoderUsageLimitError",
    "SessionHooks",
    "StepRecord",
    "ToolCallRecord",
    "TransportEvent",
    "TurnResult",
    "client_tool",
    "is_retryable",
]
