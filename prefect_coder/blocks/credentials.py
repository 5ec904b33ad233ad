"""``CoderCredentials``: where the Coder deployment is, and the token to reach it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from prefect.blocks.abstract import CredentialsBlock
from pydantic import Field, SecretStr

from coder_chat import ChatClient, ChatOptions, ChatSession, CoderConfigError
from coder_chat.client.events import TransportCallback
from coder_chat.settings import CoderSettings
from prefect_coder.blocks._project import DOCS_URL, LogoUrl
from prefect_coder.blocks._shared import shared_client


class CoderCredentials(CredentialsBlock):
    """Credentials for a Coder deployment's chat API (Coder Agents).

    Example:
        Load saved credentials and run a turn (in async code, such as an async flow, load
        with ``await CoderCredentials.aload("BLOCK_NAME")``):
        ```python
        from prefect_coder.blocks import CoderCredentials

        credentials = CoderCredentials.load("BLOCK_NAME")


        async def summarise() -> str:
            session = credentials.session(labels={"workflow": "nightly"})
            result = await session.generate("Summarise the open issues.")
            await session.aclose()
            return result.text
        ```
    """

    _block_type_name: ClassVar[str] = "Coder Credentials"
    _block_type_slug: ClassVar[str] = "prefect-coder-credentials"
    _description: ClassVar[str] = (
        "The address of a Coder deployment, a session token and the organization its chats "
        "belong to: what every prefect-coder flow needs to reach Coder Agents. An empty token "
        "or organization falls back to the worker's environment (CODER_SESSION_TOKEN, "
        "CODER_ORG_ID); to take all three from it, leave a flow's credentials empty instead. "
        "The token is saved as a secret: once saved, the UI shows it only as asterisks, and "
        "no log line, artifact or repr carries it."
    )
    _documentation_url: ClassVar[Any] = DOCS_URL
    _logo_url: ClassVar[Any] = LogoUrl()

    # Required, so that a saved block's reference ({"$ref": ...}) can never also read as
    # the block's own fields: Prefect refuses a parameter that matches both.
    base_url: str = Field(
        title="Base URL",
        description="URL of the Coder deployment, e.g. https://coder.example.com.",
    )
    token: SecretStr = Field(
        default=SecretStr(""),
        title="Session token",
        description="A Coder session token (empty: CODER_SESSION_TOKEN).",
    )
    organization_id: str = Field(
        default="",
        title="Organization ID",
        description="The organization the chats are created in (empty: CODER_ORG_ID).",
    )

    @classmethod
    def from_environment(cls) -> CoderCredentials:
        """Credentials wholly from ``CODER_URL``, ``CODER_SESSION_TOKEN`` and ``CODER_ORG_ID``."""
        return cls(base_url="")

    def resolved(self) -> tuple[str, str, str]:
        """``(base_url, token, organization_id)``, each from the block or the environment."""
        token = self.token.get_secret_value()
        if self.base_url and token and self.organization_id:
            return self.base_url, token, self.organization_id  # every task asks: stay cheap
        env = CoderSettings()
        base_url = self.base_url or env.url
        secret = token or (env.session_token.get_secret_value() if env.session_token else "")
        organization = self.organization_id or env.organization_id
        missing = [
            name
            for name, value in (
                ("base_url / CODER_URL", base_url),
                ("token / CODER_SESSION_TOKEN", secret),
                ("organization_id / CODER_ORG_ID", organization),
            )
            if not value
        ]
        if missing:
            raise CoderConfigError("Coder credentials are incomplete: set " + ", ".join(missing))
        assert base_url and organization
        return base_url, secret, organization

    def get_client(self, **options: Any) -> ChatClient:
        """A new :class:`ChatClient` for this deployment (close it with ``aclose``)."""
        base_url, token, _ = self.resolved()
        return ChatClient(base_url=base_url, token=token, **options)

    def shared_client(self, on_transport_event: TransportCallback | None = None) -> ChatClient:
        """The client this process shares for these credentials on the running event loop.

        Do not close it: it serves every task of the process (it closes when the process
        exits). ``on_transport_event`` is used only by the call that creates it.
        """
        base_url, token, _ = self.resolved()
        return shared_client(base_url, token, on_transport_event)

    def session(
        self,
        *,
        chat_id: str | None = None,
        last_seen_message_id: int | None = None,
        tools: Sequence[Any] = (),
        options: ChatOptions | None = None,
        **option_fields: Any,
    ) -> ChatSession:
        """A :class:`ChatSession` on a new chat, or resuming ``chat_id``, with a client of
        its own; ``options``, or its fields as keywords (``labels=``, ``request_timeout=``)."""
        base_url, token, organization = self.resolved()
        return ChatSession.connect(
            base_url,
            token,
            organization,
            options=options or ChatOptions(**option_fields),
            tools=tools,
            chat_id=chat_id,
            last_seen_message_id=last_seen_message_id,
        )
