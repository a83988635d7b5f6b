"""The project's exceptions: one base, context kept as attributes, safe to pickle.

MnemoError
├── ConfigError               a setting is wrong or a backend name is unknown
│   ├── UnknownBackendError
│   └── EmbedderMismatchError stored vectors were written by another embedder than this run's
├── OptionalDependencyError   an extra (e.g. `vllm`) is not installed
├── InvalidUserIdError        a user id fails the strict id pattern
├── StoreError                the LanceDB store cannot be used as asked
│   ├── CorruptWeightsError   a stored reranker version fails its checksum, shape or value check
│   └── StoreBusyError        another writer held the store's write lease longer than the wait
├── RunInProgressError        another consolidation run still holds the store's run lease
├── IngestError               an archive cannot be read at all (bad rows are quarantined instead)
└── LLMError
    ├── LLMTransientError     worth retrying (timeouts, 429, 5xx)
    ├── LLMResponseError      the model answered, but not valid JSON for the schema
    │   └── InvalidAnswerError  a schema-valid answer fails a prompt's own check (also a ValueError)
    └── ReplayMissError       the `replay` backend has no recorded answer

Errors carry their arguments so Prefect and Dask can move them between processes.
HTTP status codes are chosen only in the service layer.
"""
from __future__ import annotations

from typing import Any


class MnemoError(Exception):
    """Base of every error mnemo raises on purpose."""

    def __init__(self, message: str, **context: Any) -> None:
        super().__init__(message)
        self.message = message
        self.context = context
        for key, value in context.items():
            setattr(self, key, value)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.message, self.context))

    def __str__(self) -> str:
        return self.message


def _rebuild(cls: type[MnemoError], message: str, context: dict[str, Any]) -> MnemoError:
    err = cls.__new__(cls)
    MnemoError.__init__(err, message, **context)
    return err


class ConfigError(MnemoError):
    """A setting has a value mnemo cannot use."""


class UnknownBackendError(ConfigError):
    """A backend was asked for by a name no registry knows."""

    def __init__(self, kind: str, name: str, known: list[str]) -> None:
        super().__init__(
            f"unknown {kind} backend: {name!r} (known: {', '.join(sorted(known))})",
            kind=kind, name=name, known=known,
        )


class EmbedderMismatchError(ConfigError):
    """The store's vectors were written by one embedder and this run uses another: their vectors are not
    comparable, so they are not mixed."""

    def __init__(self, recorded: str, current: str) -> None:
        super().__init__(
            f"the store's vectors were written by embedder {recorded!r} but this run uses {current!r}; "
            "vectors of different embedders are not comparable: use the embedder the store was built with "
            "(MNEMO_EMBED_MODEL / MNEMO_EMBED_BACKEND) or a new store",
            recorded=recorded, current=current,
        )


class OptionalDependencyError(MnemoError):
    """An optional extra is needed and missing."""

    def __init__(self, package: str, extra: str) -> None:
        super().__init__(
            f"{package} is not installed; install it with: pip install -e '.[{extra}]'",
            package=package, extra=extra,
        )


class InvalidUserIdError(MnemoError, ValueError):
    """A user id does not match the strict pattern every read and write relies on."""

    def __init__(self, user_id: object) -> None:
        super().__init__(
            f"invalid user id {str(user_id)[:80]!r}: use 1-128 characters of letters, digits and . _ - : @ "
            "(starting with a letter or digit)",
            user_id=user_id,
        )


class StoreError(MnemoError):
    """The store cannot do what was asked (wrong embedding size, missing table...)."""


class CorruptWeightsError(StoreError):
    """Stored model weights (a reranker version) fail their checksum, shape or value check."""


class StoreBusyError(StoreError):
    """Another writer held the store's write lease (memory.lease) longer than a write may wait."""


class VersionGoneError(StoreError):
    """A table version a reader pinned is gone (a forget's purge or a compaction cleaned it up): re-pin
    to the store's current snapshot and read again."""


class RunInProgressError(MnemoError):
    """Another consolidation run still holds the store's run lease (memory.lease): this run is skipped."""


class IngestError(MnemoError):
    """An archive cannot be read at all (a bad row is quarantined, not raised)."""


class AppendTooLargeError(IngestError):
    """An append batch carries more turns than `Settings.append_max_messages`: split it."""


class LLMError(MnemoError):
    """An LLM backend failed."""


class LLMTransientError(LLMError):
    """A failure worth retrying: timeouts, rate limits, server errors."""


class LLMResponseError(LLMError):
    """The model answered, but the answer is not valid JSON for the expected schema."""


class InvalidAnswerError(LLMResponseError, ValueError):
    """A schema-valid answer fails a prompt's own check (a `validate` callback or a strict parser).

    Also a ValueError: the runner re-asks once, then quarantines, when a `validate` callback raises one.
    """


class ReplayMissError(LLMError):
    """The `replay` backend has no recorded response for a request."""
