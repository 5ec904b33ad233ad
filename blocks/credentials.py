"""``CoderCredentials``: where the Coder deployment is, and the token to reach it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from prefect.blocks.abstract import CredentialsBlock
from pydantic import Field, SecretStr

from coder_chat import ChatClient, ChatSession, CoderConfigError
from coder_chat.settings import CoderSettings

DOCS_URL = "https://coder.com/docs"


class CoderCredentials(CredentialsBlock):
    """Credentials for a Coder deployment's chat API (Coder Agents).

    Empty fields fall back to the environment: ``CODER_URL``,
    ``CODER_SESSION_TOKEN`` and ``CODER_ORG_ID``. The token is a secret: it is
    never shown in the UI, a log line or a repr.

    Example:
        Load saved credentials and run a turn:
        ```python
        from blocks import CoderCredentials

        credentials = CoderCredentials.load("BLOCK_NAME")
        session = credentials.session(labels={"workflow": "nightly"})
        result = await session.generate("Summarise the open issues.")
        ```
    """

    _block_type_name: ClassVar[str] = "Coder Credentials"
    _block_type_slug: ClassVar[str] = "prefect-coder-credentials"
    _documentation_url: ClassVar[Any] = DOCS_URL

    base_url: str | None = Field(
        default=None,
        title="Base URL",
        description="URL of the Coder deployment, e.g. https://coder.example.com (default: CODER_URL).",
    )
    token: SecretStr | None = Field(
        default=None,
        description="Coder session token (default: CODER_SESSION_TOKEN).",
    )
    organization_id: str | None = Field(
        default=None,
        title="Organization ID",
        description="Organization the chats are created in (default: CODER_ORG_ID).",
    )

    def resolved(self) -> tuple[str, str, str]:
        """``(base_url, token, organization_id)``, each from the block or the environment."""
        env = CoderSettings()
        base_url = self.base_url or env.url
        secret = self.token or env.session_token
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
        assert base_url and secret and organization
        return base_url, secret.get_secret_value(), organization

    def get_client(self, **options: Any) -> ChatClient:
        """A :class:`ChatClient` for this deployment (close it with ``aclose``)."""
        base_url, token, _ = self.resolved()
        return ChatClient(base_url=base_url, token=token, **options)

    def session(
        self,
        *,
        chat_id: str | None = None,
        last_seen_message_id: int | None = None,
        tools: Sequence[Any] = (),
        **options: Any,
    ) -> ChatSession:
        """A :class:`ChatSession` on a new chat, or resuming ``chat_id``."""
        base_url, token, organization = self.resolved()
        return ChatSession(
            base_url=base_url,
            token=token,
            organization_id=organization,
            chat_id=chat_id,
            last_seen_message_id=last_seen_message_id,
            tools=tools,
            **options,
        )
