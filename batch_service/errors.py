"""Errors of the batch service.

BatchError
├── ApiError        an answer to a client: HTTP status, OpenAI error code, message, param
└── StoreError      the file store failed (I/O): 500 to a client, a retry for the runner
"""

from __future__ import annotations

__all__ = ["ApiError", "BatchError", "StoreError"]


class BatchError(Exception):
    pass


class ApiError(BatchError):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str,
        param: str | None = None,
        type_: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.type = type_

    def body(self) -> dict[str, object]:
        """OpenAI's error envelope."""
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


class StoreError(BatchError):
    pass
