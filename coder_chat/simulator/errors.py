"""The simulator's error answers: Coder's ``{message, detail, validations}`` body."""

from __future__ import annotations

from typing import Any

from .state import JSON

NOT_FOUND = "Resource not found or you do not have access to this resource"


class ApiError(Exception):
    """An HTTP error answer with Coder's body shape."""

    def __init__(
        self,
        status: int,
        message: str,
        detail: str | None = None,
        validations: list[JSON] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(f"{status} {message}")
        self.status = status
        self.message = message
        self.detail = detail
        self.validations = validations
        self.extra = extra

    def body(self) -> JSON:
        out: JSON = {"message": self.message}
        if self.detail is not None:
            out["detail"] = self.detail
        if self.validations:
            out["validations"] = self.validations
        out.update(self.extra)
        return out


def not_found() -> ApiError:
    return ApiError(404, NOT_FOUND)


def bad_request(message: str, detail: str | None = None) -> ApiError:
    return ApiError(400, message, detail)


def conflict(message: str, detail: str | None = None) -> ApiError:
    return ApiError(409, message, detail)
