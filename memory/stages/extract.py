"""The extract stage, PREMem step 1: categorized episodic fragments per pending session, from the LLM
backend (one batch for the shard) or, for sessions with imported observations (LoCoMo's recorded
extraction), from the observations with category, key phrase and date from the text heuristics.

A model's answer is bounded: the decoded schema holds it to what fits `Settings.llm_max_tokens` (at
the default 2048, 6-8 items per category, 18-24 in all: `memory.llm.structured`), while a long chat
session says far more (a BEAM session of 56-72 messages: 67-77 statements of the user's alone, by `rules`' count). So a
session longer than `Settings.extract_window_messages` (12) goes to a model (any backend that answers
from the response cache: live ones and `replay`) as windows of consecutive messages, as few as the
limit allows and of even sizes, one request each (the system prompt still names every participant
of the session); a window's items cite only its own messages, and the windows' items, in order, make
the session's fragments exactly as one answer's would (`dedupe_items`, the per-turn cap, ids from the
content and sources). A session that fits one window sends the very request it always did, so
recorded answers still serve it. `rules` has no token limit and reads a whole session (it drops a
statement repeated later in the session), so it always gets one request per session. A reopened
session's `messages` are only those not extracted yet, so only they are windowed and sent.

An answer with items none of which is usable (each cites a message its request does not show, after
the prompt's "[id]" decoration is read as the id, or has an impossible date or a blank field) is
invalid (`prompts.premem.validate_extraction`): asked again once, then quarantined with its raw
text, and the session's extraction stays pending (retried next run) instead of being marked done
with its fragments lost (the runner's check sees each answer's own request). When any window of a session is quarantined the
session keeps none of this run's fragments: its retry extracts it whole again (the good windows come
from the response cache), and keeping half would leave the later stages' clusters of a partial session.

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
from memory.prompts.premem import validate_extraction
from memory.settings import Settings
from memory.stages.shard import (SessionWork, ShardState, StageContext, fragment_row,
                                 quarantine_work, timed)
from memory.text import categorize, cites_only, key_phrase, said_by

OBSERVATION_VERSION = "observation-import-v1"


def extract(state: ShardState, ctx: StageContext) -> ShardState:
    """PREMem step 1 for every pending session of the shard, as one LLM batch (a long session in
    windows, see the module doc). A reopened session sends only its messages not extracted yet; a
    quarantined extraction stays pending (`progress`)."""
    with timed(state, "extract"):
        to_llm = [s for s in state.sessions if s.extracts and not s.observed and s.messages]
        if to_llm:
            with ctx.llm(state) as runner:
                backend = runner.backend
                requests = extraction_requests(
                    to_llm, ctx.settings.extract_window_messages if backend.reads_cache else None)
                answers, bad = runner.run(requests, validate=lambda a, r: validate_extraction(a, shown_ids(r)))
            lost = {_session_key(q.request) for q in bad}
            items: dict[tuple[str, str], list[dict[str, Any]]] = {}
            for request, answer in zip(requests, answers):
                if answer is not None:
                    items.setdefault(_session_key(request), []).extend(
                        prompts.parse_extraction(answer, shown_ids(request)))
            for session in to_llm:
                key = (session.user_id, session.session_id)
                if key in lost:
                    continue
                for item in about_the_user(dedupe_items(items.get(key, [])), session, ctx.settings):
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


def shown_ids(request: LLMRequest) -> set[str]:
    """The message ids an extraction request shows (what its answer may cite)."""
    return {m["message_id"] for m in request.context["messages"]}


def _session_key(request: LLMRequest) -> tuple[str, str]:
    return request.context["user_id"], request.context["session_id"]


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


def extraction_requests(sessions: list[SessionWork], window: int | None = None) -> list[LLMRequest]:
    """The extraction requests of the sessions in order: one per session, or, given a `window`, one
    per window of at most that many consecutive messages of a longer session (`windows`)."""
    return [prompts.extract_request(part) for s in sessions for part in windows(s.context(), window)]


def windows(context: dict[str, Any], size: int | None) -> list[dict[str, Any]]:
    """A session's request context split into the fewest windows of at most `size` consecutive
    messages, of even sizes (25 messages, size 12: 8, 8, 9); the context itself when it fits one.
    Each keeps the session's ids and participants."""
    msgs = context["messages"]
    if size is None or len(msgs) <= size:
        return [context]
    n = -(-len(msgs) // size)
    cuts = [i * len(msgs) // n for i in range(n + 1)]
    return [{**context, "messages": msgs[a:b]} for a, b in zip(cuts, cuts[1:])]


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
