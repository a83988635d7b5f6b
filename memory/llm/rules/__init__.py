"""The `rules` backend: a deterministic, CPU-only stand-in for every LLM step.

It answers the same structured requests as a real model (it reads each request's `context`, not the
rendered prose) with heuristics, so the whole pipeline runs anywhere, fast, with no model and no
network. **Its answers are clearly lower quality than an LLM's**: it does not understand the text.

* ``extract`` (PREMem step 1): splits every message into sentences, keeps those that say something
  personal about their speaker (first-person or a named entity; no questions, greetings or fillers),
  categorizes them with PREMem's cue words (:func:`memory.text.categorize`), rewrites them in the third
  person about the speaker (:func:`memory.text.third_person`), takes a short key phrase
  (:func:`memory.text.key_phrase`) and normalizes the date relative to the message date
  (:func:`memory.dates.normalize_date`). Anything said about the other participant, anything implied,
  and anything needing world knowledge is missed; the value is the speaker's sentence, not a paraphrase.
* ``reason`` (PREMem step 2): template insights over one linked cluster pair, 0-3 per pair:
  accumulation (repeated similar statements), transformation (same topic, different content or a
  sentiment flip), extension (experiences that match a stated preference) and connection (a shared
  named entity or rare word across different topics). No causal or implicit inference.
* ``topics`` / ``topic-merge`` (RMM prospective reflection): a session cut into topics at embedding
  breakpoints, the participant's statements per topic; merge into the most similar history topic
  above a cosine threshold, else add.
* ``summarize`` / ``profile`` (MemWeaver): the most central fragments / phase summaries, quoted.

Tasks are plain functions from a request's context to its JSON answer, registered by name in
:data:`TASKS` (`registry.py`), one module per task: `extract.py` (with the statement filter in
`statements.py`), `reason.py`, `topics.py`, `summarize.py`. Importing this package registers every
task and the backend (`backend.py`) under the name "rules"; a task with no rule comes back as an
error response, never a guess.
"""
from __future__ import annotations

from memory.llm.rules.registry import TASKS, Task, rule
from memory.llm.rules.extract import extract_answer
from memory.llm.rules.reason import reason_answer
from memory.llm.rules.topics import topic_merge_answer, topic_segments, topics_answer
from memory.llm.rules.summarize import central_order, profile_answer, summarize_answer
from memory.llm.rules.statements import personal_statements, vocative_forms
from memory.llm.rules.backend import RulesBackend
from memory.text import categorize, key_phrase, split_sentences, third_person

__all__ = ["RulesBackend", "TASKS", "Task", "rule", "extract_answer", "reason_answer", "topic_segments",
           "topics_answer", "topic_merge_answer", "central_order", "summarize_answer", "profile_answer",
           "personal_statements", "vocative_forms",
           "categorize", "key_phrase", "third_person", "split_sentences"]
