"""The extract stage, PREMem step 1: categorized episodic fragments per pending session, from the LLM
backend (one batch for the shard) or, for sessions with imported observations (LoCoMo's recorded
extraction), from the observations with category, key phrase and date from the text heuristics.

Of the fragments whose every source turn was said by an assistant (`RetrievalSettings.assistant_speakers`)
each turn keeps its first `Settings.assistant_fragments_per_turn` (None: all): retrieval never
searches them, and on assistant chats they are most of the fragments (BEAM: about 70 %, a long
reply becomes dozens), hence most of the embedding; the few kept carry the reply's gist into the
topics, clusters and insights that also cite the user's turns."""
from __future__ import annotations

from typing import Any

from memory import prompts
from memory.dates import local_time, normalize_date
from memory.llm.base import LLMRequest
from memory.llm.runner import Quarantined
from memory.settings import Settings
from memory.stages.shard import (SessionWork, ShardState, StageContext, fragment_row,
                                 quarantine_work, timed)
from memory.text import categorize, cites_only, key_phrase, said_by

OBSERVATION_VERSION = "observation-import-v1"


def extract(state: ShardState, ctx: StageContext) -> ShardState:
    """PREMem step 1 for every pending session of the shard, as one LLM batch. A reopened session
    sends only its messages not extracted yet; a quarantined extraction stays pending (`progress`)."""
    with timed(state, "extract"):
        to_llm = [s for s in state.sessions if s.extracts and not s.observed and s.messages]
        if to_llm:
            with ctx.llm(state) as runner:
                backend = runner.backend
                answers, bad = runner.run(extraction_requests(to_llm))
            for session, answer in zip(to_llm, answers):
                if answer is None:
                    continue
                ids = {m["message_id"] for m in session.messages}
                items = dedupe_items(prompts.parse_extraction(answer, ids))
                for item in about_the_user(items, session, ctx.settings):
                    state.fragments.append(fragment_row(session, item, run_id=state.run_id, backend=backend.name,
                                                        model=backend.model, prompt_version=prompts.EXTRACT_VERSION))
            for q, session in quarantined_sessions(bad, to_llm):
                quarantine_work(state, q.row(session.user_id, state.run_id, session.session_id),
                                session.user_id, session.session_id, "extract")
        for session in (s for s in state.sessions if s.observed and s.extracts):
            for item in about_the_user(dedupe_items(observation_items(session)), session, ctx.settings):
                state.fragments.append(fragment_row(session, item, run_id=state.run_id, backend="observations",
                                                    model="recorded", prompt_version=OBSERVATION_VERSION))
    return state


def about_the_user(items: list[dict[str, Any]], session: SessionWork, settings: Settings) -> list[dict[str, Any]]:
    """The items in order, those sourced only from assistant turns capped per turn (see the module doc)."""
    cap = settings.assistant_fragments_per_turn
    said = said_by(session.messages, settings.retrieval.assistant_speakers)
    if cap is None or not said:
        return items
    kept: dict[tuple[str, ...], int] = {}
    out = []
    for it in items:
        sources = tuple(it["source_ids"])
        if cites_only(sources, said):
            if kept.get(sources, 0) >= cap:
                continue
            kept[sources] = kept.get(sources, 0) + 1
        out.append(it)
    return out


def quarantined_sessions(bad: list[Quarantined], sessions: list[SessionWork]) -> list[tuple[Quarantined, SessionWork]]:
    """Each quarantined extraction request with the session it was for."""
    by_key = {(s.user_id, s.session_id): s for s in sessions}
    out = []
    for q in bad:
        c = q.request.context
        out.append((q, by_key[(c["user_id"], c["session_id"])]))
    return out


def observation_items(session: SessionWork) -> list[dict[str, Any]]:
    """Imported observations as fragment items: category, key and date from the text heuristics."""
    items = []
    for obs in session.observations or []:
        content = obs["content"].strip()
        category = categorize(content)
        items.append({
            "subject": obs["subject"], "category": category, "key": key_phrase(content, obs["subject"]),
            "content": content, "date": normalize_date(
                content, local_time(session.messages[0]) if session.messages else session.ts, category),
            "source_ids": list(obs["source_ids"]),
        })
    return items


def extraction_requests(sessions: list[SessionWork]) -> list[LLMRequest]:
    """One extraction request per session."""
    return [prompts.extract_request(s.context()) for s in sessions]


def dedupe_items(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Drop exact repeats an LLM sometimes emits (same category, subject, content, sources)."""
    seen: set[tuple[Any, ...]] = set()
    out = []
    for it in items:
        key = (it["category"], it["subject"].lower(), it["content"].lower(), tuple(it["source_ids"]))
        if key not in seen:
            seen.add(key)
            out.append(it)
    return out
