"""Prompts as data: a function from context to chat messages, the JSON schema the answer must
satisfy, a version recorded on every row it produces, and a parser back to plain dicts.

One module per paper: `premem.py` (PREMem Appendix A: extraction and reasoning, adapted to
conversations with several named participants), `rmm.py` (RMM Appendix D.1: topic extraction and
merging), `memweaver.py` (MemWeaver Appendix C.1: phase summaries and the profile); `common.py` holds
the chat-message helper they share. Every public name is re-exported here, so
`from memory import prompts; prompts.extract_request(...)` is the usual way in. A schema-valid answer
that fails a prompt's own check raises `memory.errors.InvalidAnswerError` (a ValueError too).
"""
from __future__ import annotations

from memory.llm.base import LLMRequest
from memory.prompts.common import chat
from memory.prompts.memweaver import (PROFILE_MAX_WORDS, PROFILE_SCHEMA, PROFILE_SYSTEM, PROFILE_TASK,
                                      PROFILE_VERSION, SUMMARIZE_SCHEMA, SUMMARIZE_SYSTEM, SUMMARIZE_TASK,
                                      SUMMARIZE_VERSION, parse_profile, parse_summary, profile_request,
                                      summarize_request, validate_profile,
                                      validate_summary)
from memory.prompts.premem import (CATEGORY_KEYS, DATE_PATTERN, EXTRACT_SCHEMA, EXTRACT_SYSTEM, EXTRACT_VERSION,
                                   INFERENCE_ALIASES, REASON_SCHEMA, REASON_SYSTEM, REASON_VERSION,
                                   extract_request, parse_extraction, parse_reasoning, reason_request)
from memory.prompts.rmm import (TOPIC_EXTRACT_SYSTEM, TOPIC_EXTRACT_VERSION, TOPIC_MERGE_SYSTEM,
                                TOPIC_MERGE_VERSION, parse_topic_extraction, parse_topic_merge,
                                topic_extract_request, topic_extract_schema, topic_merge_request,
                                topic_merge_schema)

__all__ = [
    "LLMRequest", "chat",
    # PREMem
    "EXTRACT_VERSION", "REASON_VERSION", "DATE_PATTERN", "CATEGORY_KEYS", "INFERENCE_ALIASES", "EXTRACT_SCHEMA",
    "REASON_SCHEMA", "EXTRACT_SYSTEM", "REASON_SYSTEM", "extract_request", "parse_extraction", "reason_request",
    "parse_reasoning",
    # RMM
    "TOPIC_EXTRACT_VERSION", "TOPIC_MERGE_VERSION", "TOPIC_EXTRACT_SYSTEM", "TOPIC_MERGE_SYSTEM",
    "topic_extract_schema", "topic_merge_schema", "topic_extract_request", "parse_topic_extraction",
    "topic_merge_request", "parse_topic_merge",
    # MemWeaver
    "SUMMARIZE_VERSION", "PROFILE_VERSION", "PROFILE_MAX_WORDS", "SUMMARIZE_SYSTEM", "SUMMARIZE_TASK",
    "PROFILE_SYSTEM", "PROFILE_TASK", "SUMMARIZE_SCHEMA", "PROFILE_SCHEMA", "summarize_request",
    "profile_request", "validate_summary", "validate_profile", "parse_summary", "parse_profile",
]
