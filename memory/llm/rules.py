"""The `rules` backend: a deterministic, CPU-only stand-in for every LLM step.

It answers the same structured requests as a real model (it reads each request's `context`, not the
rendered prose) with heuristics, so the whole pipeline runs anywhere, fast, with no model and no
network. **Its answers are clearly lower quality than an LLM's**: it does not understand the text.

* ``extract`` (PREMem step 1): splits every message into sentences, keeps those that say something
  personal about their speaker (first-person or a named entity; no questions, greetings or fillers),
  categorizes them with PREMem's cue words (:func:`categorize`), rewrites them in the third person
  about the speaker (:func:`third_person`), takes a short key phrase (:func:`key_phrase`) and
  normalizes the date relative to the message date (:func:`memory.dates.normalize_date`). Anything
  said about the other participant, anything implied, and anything needing world knowledge is missed;
  the value is the speaker's sentence, not a paraphrase.
* ``reason`` (PREMem step 2): template insights over one linked cluster pair, 0-3 per pair:
  accumulation (repeated similar statements), transformation (same topic, different content or a
  sentiment flip), extension (experiences that match a stated preference) and connection (a shared
  named entity or rare word across different topics). No causal or implicit inference.

Tasks are plain functions from a request's context to its JSON answer, registered by name in
:data:`TASKS`; a task with no rule comes back as an error response, never a guess.
"""
from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from typing import Any

from memory.dates import IRREGULAR_PAST, normalize_date, time_match, to_date
from memory.llm.base import LLMBackend, LLMRequest, LLMResponse, register_backend
from memory.segments import breakpoints

__all__ = ["RulesBackend", "TASKS", "rule", "categorize", "key_phrase", "third_person",
           "split_sentences", "extract_answer", "reason_answer"]

#: task name -> function(context) -> JSON-serializable answer that satisfies the request's schema
TASKS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {}


def rule(task: str) -> Callable[[Callable[[dict[str, Any]], dict[str, Any]]], Callable[[dict[str, Any]], dict[str, Any]]]:
    """Register the rule that answers `task`."""
    def deco(fn: Callable[[dict[str, Any]], dict[str, Any]]) -> Callable[[dict[str, Any]], dict[str, Any]]:
        TASKS[task] = fn
        return fn
    return deco


@register_backend("rules")
class RulesBackend(LLMBackend):
    """Deterministic heuristics for every LLM step (see the module docstring for what they miss)."""

    name = "rules"
    live = False
    default_model = "rules-v1"

    def complete(self, requests: list[LLMRequest]) -> list[LLMResponse]:
        out: list[LLMResponse] = []
        for req in requests:
            fn = TASKS.get(req.task)
            if fn is None:
                out.append(LLMResponse.failure("fatal", f"rules backend has no rule for task {req.task}"))
                continue
            try:
                answer = fn(req.context)
            except Exception as exc:  # a bad context is this request's error, not the batch's; the rules
                # are deterministic, so asking again gives the same failure: quarantine, do not retry
                out.append(LLMResponse.failure("rejected", f"rules backend failed on task {req.task}: {exc!r}"))
                continue
            out.append(LLMResponse(text=json.dumps(answer, ensure_ascii=False)))
        return out


# --------------------------------------------------------------------------------------------------
# word lists
# --------------------------------------------------------------------------------------------------

def _words(s: str) -> frozenset[str]:
    return frozenset(s.split())


_STOP = _words("""
a an the and or but nor so yet for of to in on at by with from into onto about above below over under
up down out off than then as if because while when where what which who whom whose why how that this
these those there here it its it's itself is am are was were be been being do does did done doing have
has had having will would shall should can could may might must not no yes just only also too very
really so such quite pretty super totally truly definitely absolutely actually literally basically
i i'm i've i'll i'd me my mine myself we we're we've we'll we'd us our ours ourselves you you're
you've you'll you'd your yours yourself yourselves he he's him his himself she she's her hers herself
they they're they've they'll they'd them their theirs themselves it'll that's there's here's what's
let's who's how's where's gonna wanna gotta kinda sorta lot lots bit some any all every each each
other another more most much many few little own same other else ever never always often usually
sometimes still even again already now soon later today yesterday tomorrow tonight week weeks weekend
weekends month months year years day days night morning evening afternoon ago last next past recently
lately time times thing things stuff something anything everything nothing someone anyone everyone
way ways kind sort yeah yep oh wow hey hi hello thanks thank please okay ok sure well like love
loved loves liked likes hate hated enjoy enjoyed enjoys prefer preferred think thought believe
believed feel felt feeling feelings want wanted wants wish hope hoped hoping plan planned planning
plans going go goes went gone get gets got gotten getting make makes made making take takes took taken
taking give gives gave given giving come comes came coming see sees saw seen seeing know knows knew
known say says said tell told try tried trying keep kept let put set look looks looked looking seem
seems seemed find found use used need needs needed start started starting begin began did visited
attended bought joined met ran great good awesome amazing cool nice fun fantastic wonderful incredible
terrible bad best better worse worst big small huge new old happy sad glad excited exciting thrilled
grateful thankful proud glad sure able important special hard tough easy interesting favorite
favourite goal goals dream dreams definitely maybe probably perhaps almost mostly exactly especially
because though although however anyway besides also since until unless whether both either neither
one two three four five first second lots monday tuesday wednesday thursday friday saturday sunday
january february march april june july august september october november december mean means meant
guess suppose gonna glad right totally true truly im ive ill id dont cant wont didnt doesnt isnt
through across around among along behind beyond within without toward towards upon via
per against despite during near thinking bring brings bringing help helps helping keep keeps
keeping share sharing step steps moment moments part together able place world stuff anymore
check life difference people folks guys
agree agreed cause 'cause cuz gotta wanna yourself ourselves chose decided tried helped shared talked
""")

_FIRST_PERSON_COUNT_RE = re.compile(r"\b(?:i|i'm|i've|i'll|i'd|me|my|mine|myself)\b")     # lower-cased text
_INTERJECTION_RE = re.compile(
    r"^(?:(?:wow+|whoa+|hey+|hi+|hello|oh+|ah+|aw+|yeah+|yes|yep|yup|no|nope|ok(?:ay)?|ha(?:ha)+|lol|omg"
    r"|thanks?(?:\s+so\s+much|\s+a\s+lot)?|thank\s+you(?:\s+so\s+much)?|well|hmm+|um+|uh+|sure|right"
    r"|cool|great|awesome|nice|totally|absolutely|definitely|indeed|true|congrats|congratulations"
    r"|exactly|agreed|haha|aww+|yay+|woah|gosh|man|dude|honestly|seriously|anyway|anyways)"
    r"(?:\s+[A-Z][a-z]+)?\s*[,!.:;\u2013\u2014-]+\s*)+",
    re.IGNORECASE,
)
_LEAD_CONJ_RE = re.compile(r"^(?:so|and|but|plus|anyway|also|well|oh|yeah)\s+(?=(?:i|i'm|i've|i'll|i'd|my|we|we're)\b)",
                           re.IGNORECASE)
_FILLER_START_RE = re.compile(
    r"^(?:thanks|thank\s+you|bye|see\s+you|take\s+care|good\s+luck|congrats|congratulations|talk\s+(?:to\s+you\s+)?soon"
    r"|have\s+(?:a|fun)|hope\s+you|glad\s+you|nice\s+to|good\s+to\s+see|same\s+here|me\s+too|you\s+too"
    r"|sounds\s+(?:great|good|awesome|amazing|fun)|that's\s+(?:great|awesome|amazing|so|really|cool)"
    r"|i\s+(?:\w+ly\s+)?(?:agree|hear\s+you|feel\s+you|see\s+what|get\s+(?:it|that|you)"
    r"|(?:know|understand)(?:\s*,|\s+(?:what|how|why|right|that\s+feeling|the\s+feeling|it)\b))"
    r"|i'm\s+(?:so\s+|really\s+|very\s+)?(?:happy|glad|proud|sorry)\s+(?:for|of|to\s+hear))\b",
    re.IGNORECASE,
)
_SENT_SPLIT_RE = re.compile(r"(?<=[.!?])[\"')\]]*\s+|\n+")
_FIRST_PERSON_RE = re.compile(r"\b(?:i|i'm|i've|i'll|i'd|me|my|mine|myself|we|we're|we've|we'll|we'd|our|ours|us)\b")
_SECOND_PERSON_RE = re.compile(r"\b(?:you|you're|you've|you'll|you'd|your|yours|yourself|ya)\b")
_CAP_RE = re.compile(r"(?<![.!?]\s)(?<!^)\b([A-Z][A-Za-z]+|[A-Z]{2,}[A-Za-z+]*)")
_TOKEN_RE = re.compile(r"[A-Za-z][A-Za-z'\-+]*|\d+")
_NOT_ENTITY = _words("""I I'm I've I'll I'd The A An And But So My We Our It This That Mom Dad OK Ok Okay
Monday Tuesday Wednesday Thursday Friday Saturday Sunday January February March April May June July
August September October November December Wow Hey Thanks Yeah Oh Haha LOL""")

# -- categorization cues (PREMem Figure 3 keywords, extended) --------------------------------------
_EXP_VERBS = (
    "went|did|saw|met|visited|attended|bought|started|joined|took|got|ran|made|tried|learned|learnt|"
    "finished|received|gave|found|moved|traveled|travelled|won|participated|volunteered|painted|"
    "watched|played|signed\\s+up|adopted|graduated|completed|created|built|hiked|camped|celebrated|"
    "organized|organised|hosted|spent|wrote|drew|baked|cooked|picked\\s+up|performed|competed|launched|"
    "opened|lost|quit|left|came|explored|climbed|danced|sang|taught|studied|applied|passed|became|"
    "raised|donated|helped|shared|posted|published|recorded|released|heard|chatted|talked|spoke|"
    "chose|caught|ate|drank|flew|drove|rode|swam|sold|broke|fell|grew|brought|returned|reached|enrolled|"
    "signed|switched|decided|ended|married|divorced|surprised|tried\\s+out|checked\\s+out|read\\s+a|"
    "took\\s+part|gave\\s+a|had\\s+a\\s+(?:blast|great|good|fun|wonderful|amazing|chance)"
)
# cue regexes run on the lower-cased sentence (case-insensitive matching is ~3x slower in `re`);
# only the "Name <verb>ed" pattern needs the original case
_EXP_RE = re.compile(
    rf"\b(?:{_EXP_VERBS})\b(?!')"
    r"|\b(?:have|has|'ve)\s+(?:\w+ly\s+|just\s+|also\s+|finally\s+|never\s+|ever\s+|already\s+)?"
    r"(?:been\s+to|tried|visited|done|seen|met|finished|completed|started|joined|experienced|learned|made)\b"
    r"|\bwhen\s+i\s+was\b",
)
_EXP_CASED_RE = re.compile(
    r"\b(?:[Ii]|[Ww]e|[A-Z][a-z]+)\s+(?:just\s+|also\s+|finally\s+|recently\s+|actually\s+|even\s+)?"
    r"(?!need|feed|proceed|succeed|exceed|indeed)[a-z]{2,}ed\b"
)
_SUBJ_RE = re.compile(
    r"\b(?:i|we|'d|would|do|don't|n't|really|also|just|totally|still|always|definitely)\s+"
    r"(?:really\s+|also\s+|just\s+|totally\s+)?like[sd]?\b"
    r"|\b(?:likes|love[sd]?|loving\s+it|hate[sd]?|prefer(?:s|red)?|enjoy(?:s|ed|ing)?|adore[sd]?|think(?:s|ing)?"
    r"|believe[sd]?|feel(?:s|ing)?|felt|want(?:s|ed)?|wish(?:es)?|plan(?:s|ning|ned)?\s+(?:to|on)|planning"
    r"|stoked|pumped|eager|keen|curious|worry|worries"
    r"|hope[sd]?|hoping|going\s+to|gonna|usually|often|always|sometimes|every\s+(?:day|week|morning|night|weekend)"
    r"|each\s+day|goal|dream(?:s|ing)?|passion(?:ate)?|favou?rite|excited|thrilled|grateful|thankful"
    r"|happy|proud|glad|nervous|worried|scared|afraid|anxious|stressed|sad|lonely|hopeful|optimistic"
    r"|inspired|motivated|determined|fascinated|interested\s+in|fan\s+of|fond\s+of|into\s+(?!the\b)"
    r"|can't\s+wait|looking\s+forward|realiz(?:e|ed|ing)|appreciate[sd]?|care\s+about|miss(?:es|ed)?"
    r"|mean[st]?\s+a\s+lot|important\s+to|would\s+love|rather|opinion|fav)\b"
    r"|'ll\b",
)


def categorize(sentence: str) -> str:
    """PREMem category of one statement from cue words: "factual", "experiential" or "subjective".

    Experiential (past events: went, visited, attended, "yesterday", "last week", I've tried ...) wins
    when its cue comes first or a specific past time is named; subjective (like, love, think, want,
    plan to, usually, my goal ...) otherwise when present; everything else (is, have, live, work as)
    is factual. Works on first-person sentences and on third-person ones ("Melanie ran a race").
    """
    low = sentence.lower()
    exp_pos = [m.start() for m in (_EXP_RE.search(low), _EXP_CASED_RE.search(sentence)) if m is not None]
    exp = min(exp_pos) if exp_pos else None
    m_subj = _SUBJ_RE.search(low)
    subj = m_subj.start() if m_subj is not None else None
    tm = time_match(sentence)
    past_time = tm is not None and tm[0] == "past"
    if exp is not None or past_time:
        if subj is None or (exp is not None and exp < subj) or past_time:
            return "experiential"
    if subj is not None:
        return "subjective"
    if exp is not None:
        return "experiential"
    return "factual"


# -- third person ---------------------------------------------------------------------------------
_ADVERBS = ("just|also|still|never|always|even|really|too|now|then|often|sometimes|already|finally|"
            "recently|usually|totally|actually|definitely|kinda|sorta|truly|mostly|only|almost|rarely|"
            "seldom|hardly|genuinely|absolutely|honestly|seriously|certainly|probably|barely|generally|"
            "normally|typically|currently|constantly|literally|simply|deeply|personally")
_I_RE = re.compile(
    r"\b(?:I|i)(?P<contr>['\u2019](?:m|ve|ll|d))?\b"
    rf"(?P<adv>(?:\s+(?:{_ADVERBS})\b)*)"
    r"(?:\s+(?P<verb>[A-Za-z]+(?:'t)?))?",
)
_OBJ_RE = re.compile(r"(?<![\w'\u2019-])(?:(?P<my>[Mm]y)|(?P<mine>[Mm]ine)|(?P<myself>[Mm]yself)|(?P<me>[Mm]e))(?![\w'\u2019-])")
_NO_CONJ = _words(f"""{_ADVERBS.replace('|', ' ')} can could will would shall should may might must was
were had did used didn't can't couldn't won't wouldn't shouldn't wasn't weren't hadn't mustn't
too myself and or but as so to in at on for with a an the of that if when because who sort kind
mean guess""")
# past forms and participles; not "bit", which is mostly "a bit"
_PAST_SET = (frozenset(IRREGULAR_PAST) - {"bit"}) | _words("quit let hit cut been gone done seen")
_CONJ_MAP = {"am": "is", "have": "has", "do": "does", "don't": "doesn't", "haven't": "hasn't",
             "go": "goes", "aren't": "isn't", "ain't": "isn't", "'m": "is"}


_STOP = _STOP | _PAST_SET | frozenset(w for w in re.findall(r"[a-z]+", _EXP_VERBS) if len(w) > 3)


def _conjugate(verb: str) -> str:
    low = verb.lower()
    if low in _CONJ_MAP:
        return _CONJ_MAP[low]
    if low in _NO_CONJ or low in _PAST_SET or low.endswith(("ed", "n't", "ing")) or not low.isalpha():
        return verb
    if low.endswith(("s", "sh", "ch", "x", "z", "o")):
        return verb + "es"
    if len(low) > 2 and low.endswith("y") and low[-2] not in "aeiou":
        return verb[:-1] + "ies"
    return verb + "s"


def third_person(sentence: str, subject: str) -> str:
    """Rewrite first-person singular references as the `subject` in the third person.

    I -> Subject (with the verb agreed: "I love" -> "Subject loves", "I have" -> "Subject has"),
    I'm -> Subject is, I've -> Subject has, I'll -> Subject will, I'd -> Subject would (had before a
    participle), my/mine -> Subject's, me -> Subject, myself -> themself. "we"/"our" are left as they are.
    """
    name = subject.strip() or "The speaker"

    def i_sub(m: re.Match[str]) -> str:
        contr = (m.group("contr") or "").lower().replace("\u2019", "'")
        adv = m.group("adv") or ""
        verb = m.group("verb")
        tail = f" {verb}" if verb else ""
        if contr == "'m":
            return f"{name} is{adv}{tail}"
        if contr == "'ve":
            return f"{name} has{adv}{tail}"
        if contr == "'ll":
            return f"{name} will{adv}{tail}"
        if contr == "'d":
            aux = "had" if verb and (verb.lower() in ("been", "gone", "done", "seen", "never")
                                     or verb.lower().endswith("ed")) else "would"
            return f"{name} {aux}{adv}{tail}"
        if verb is None:
            return name
        return f"{name}{adv} {_conjugate(verb)}"

    def obj_sub(m: re.Match[str]) -> str:
        if m.group("my") or m.group("mine"):
            return f"{name}'s"
        if m.group("myself"):
            return "themself"   # gender-neutral; "Ann has been there Ann" would not read
        return name

    out = _I_RE.sub(i_sub, sentence)
    return _OBJ_RE.sub(obj_sub, out)


# -- key phrase -----------------------------------------------------------------------------------
_NAME_VERBS = _words("""is was has had loves likes wants enjoys plans hopes thinks believes feels prefers
works lives owns knows goes does says shares wishes needs tries keeps finds takes makes gets sees
recently also just really""")


def _is_content(tok: str) -> bool:
    low = tok.lower().replace("\u2019", "'")
    if low in _STOP or len(low) < 3 and not tok.isupper():
        return False
    if low.endswith(("n't", "'m", "'re", "'ve", "'ll", "'d")):
        return False
    if len(low) >= 5 and low.endswith("ed") and not low.endswith("eed"):
        return False            # past verbs and participles (emailed, excited) make poor keys
    return not low.isdigit()


def key_phrase(sentence: str, subject: str | None = None) -> str:
    """A short key phrase (2-4 content words) for a statement, deterministic.

    Stopwords, pronouns, cue verbs, intensifiers and time words split the sentence into runs of
    content words; the first run is the key, extended with the next run when it has one word only,
    and cut at four words. Proper nouns and acronyms keep their case, other words are lower-cased.
    The `subject`'s name is never part of the key; without it, a leading name in a third-person
    statement ("Melanie ran ...", "Melanie's kids ...") is dropped too.
    """
    toks = _TOKEN_RE.findall(sentence.replace("\u2019", "'"))
    names = {w.lower() for w in (subject or "").split()}
    if len(toks) > 1 and toks[0][:1].isupper() and not toks[0].isupper() and not toks[0].endswith("ing"):
        nxt = toks[1].lower()
        if (toks[0].endswith("'s") or nxt in _NAME_VERBS or nxt in _PAST_SET
                or nxt.endswith("ed") and len(nxt) > 4
                or subject is None and nxt.endswith("s") and not nxt.endswith("ss") and len(nxt) > 3):
            names.add(toks[0].lower().removesuffix("'s"))
    toks = [t for t in toks if t.lower().removesuffix("'s") not in names]
    runs: list[list[str]] = []
    cur: list[str] = []
    for i, tok in enumerate(toks):
        tok = tok.strip("-'")
        if tok.lower().endswith("'s"):
            tok = tok[:-2]
        if tok and _is_content(tok):
            keep_case = (i > 0 and tok[0].isupper()) or (len(tok) > 1 and tok.isupper())
            cur.append(tok if keep_case else tok.lower())
        elif cur:
            runs.append(cur)
            cur = []
    if cur:
        runs.append(cur)
    if not runs:
        words = [t.lower() for t in toks if t.lower() not in ("i", "i'm", "my", "me", "we", "you")]
        return " ".join(words[:3]) or "personal statement"
    words = list(runs[0])
    for run in runs[1:]:
        if len(words) >= 2:
            break
        words.extend(run)
    return " ".join(words[:4])


# -- sentences -------------------------------------------------------------------------------------
def split_sentences(text: str) -> list[str]:
    """Regex sentence split on . ! ? and line breaks (fast; abbreviations are not special-cased)."""
    return [s.strip() for s in _SENT_SPLIT_RE.split(text) if s and s.strip()]


def _clean(sentence: str) -> str:
    s = sentence.replace("\u2019", "'").replace("\u2018", "'").strip()
    prev = None
    while prev != s:
        prev = s
        s = _INTERJECTION_RE.sub("", s, count=1)
        s = _LEAD_CONJ_RE.sub("", s, count=1)
    s = s.strip(" \t-\u2013\u2014,;:")
    s = re.sub(r"[.!]+$", "", s).strip()
    if s and s[0].islower() and not s.startswith(("i ", "i'")):
        s = s[0].upper() + s[1:]
    return s


def _vocatives(participants: list[str]) -> set[str]:
    out: set[str] = set()
    for p in participants:
        for part in str(p).split():
            low = part.lower()
            out.add(low)
            out.update(low[:n] for n in range(3, len(low)))
    return out


_VOC_END_RE = re.compile(r",\s*([A-Z][a-z]+)\s*$")
_VOC_START_RE = re.compile(r"^([A-Z][a-z]+)\s*,\s*")
# "Researching adoption agencies - it's been a dream": a clause with the speaker left implicit; only a
# whole sentence, or a first clause closed by a dash, with no verb that would make the gerund a subject
_GERUND_START_RE = re.compile(
    r"^(?!(?:Exciting|Amazing|Interesting|Inspiring|Relaxing|Boring|Refreshing|Rewarding|Surprising|Touching"
    r"|Heartwarming|Annoying|Frustrating|Satisfying|Fascinating|Stunning|Charming|Outstanding|Thing|King"
    r"|Spring|Morning|Evening|Nothing|Something|Everything|Anything|Being|Seeing|Hearing|Knowing)\b)"
    r"[A-Z][a-z]{2,}ing\b(?![^\u2013\u2014]*?\b(?:is|are|was|were|can|could|will|would|must|should"
    r"|might|may|helps?|makes?|gives?|has|have|keeps?|means?|seems?|feels?|sounds?|looks?|takes?|brings?"
    r"|reminds?|plays?|sure|definitely)\b[^\u2013\u2014]*?(?:[\u2013\u2014]|\s-\s|$))"
    r"[^,;:\u2013\u2014]*?(?:[\u2013\u2014]|\s-\s|$)")


def _strip_vocative(s: str, vocatives: set[str]) -> str:
    m = _VOC_END_RE.search(s)
    if m and m.group(1).lower() in vocatives:
        s = s[:m.start()].rstrip()
    m = _VOC_START_RE.match(s)
    if m and m.group(1).lower() in vocatives:
        s = s[m.end():]
        s = s[:1].upper() + s[1:]
    return s


def _personal(s: str, vocatives: set[str]) -> bool:
    """Does the statement say something about its speaker (or a named thing)?"""
    low = s.lower()
    first = _FIRST_PERSON_RE.search(low) is not None
    n_second = len(_SECOND_PERSON_RE.findall(low))
    second = n_second > 0
    if second and n_second >= len(_FIRST_PERSON_COUNT_RE.findall(low)):
        return False            # about the other participant ("I'm so proud of you")
    if not first:
        if second:
            return False
        if not any(m.group(1) not in _NOT_ENTITY and m.group(1).lower() not in vocatives
                   for m in _CAP_RE.finditer(s)):
            return False
    n_content = sum(1 for t in _TOKEN_RE.findall(s) if _is_content(t) and t.lower() not in vocatives)
    singular = _FIRST_PERSON_COUNT_RE.search(low) is not None
    return n_content >= (1 if singular and not second else 2)


def _statements(text: str, vocatives: set[str]) -> Iterator[str]:
    """Each personal statement in one message, cleaned (first person, as said)."""
    for raw in split_sentences(text):
        if raw.rstrip("\"')").endswith("?"):
            continue
        s = _strip_vocative(_clean(raw), vocatives)
        if _GERUND_START_RE.match(s):
            s = "I'm " + s[0].lower() + s[1:]          # "Researching agencies" said of oneself
        if len(s.split()) < 4 or _FILLER_START_RE.match(s) or not _personal(s, vocatives):
            continue
        yield s


def statement_items(text: str, speaker: str, vocatives: set[str]) -> list[tuple[str, str, str, str]]:
    """(category, key, value, cleaned sentence) for each personal statement in one message."""
    return [(categorize(s), key_phrase(s, speaker), third_person(s, speaker), s)
            for s in _statements(text, vocatives)]


_CATEGORY_FIELD = {"factual": "Factual_Information", "experiential": "Experiential_Information",
                   "subjective": "Subjective_Information"}


@rule("extract")
def extract_answer(ctx: dict[str, Any]) -> dict[str, Any]:
    """PREMem step 1 over one session's messages (see `memory.prompts.extract_request`)."""
    answer: dict[str, list[dict[str, str]]] = {f: [] for f in _CATEGORY_FIELD.values()}
    participants = list(ctx.get("participants") or [])
    speakers = [m.get("speaker") for m in ctx.get("messages", [])]
    vocatives = _vocatives(participants + [s for s in speakers if s])
    seen: set[tuple[str, str]] = set()
    for m in ctx.get("messages", []):
        text = m.get("text") or ""
        speaker = str(m.get("speaker") or "").strip() or "Unknown"
        mid = str(m.get("message_id") or "")
        if not text.strip() or not mid:
            continue
        base = to_date(m["ts"])
        for cat, key, value, sentence in statement_items(text, speaker, vocatives):
            if (speaker, value.lower()) in seen:
                continue
            seen.add((speaker, value.lower()))
            answer[_CATEGORY_FIELD[cat]].append({
                "subject": speaker, "key": key, "value": value, "message_id": mid,
                "date": normalize_date(sentence, base, cat),
            })
    return answer


# --------------------------------------------------------------------------------------------------
# reason: template insights over one linked cluster pair
# --------------------------------------------------------------------------------------------------
_POSITIVE_RE = re.compile(
    r"\b(?:love[sd]?|loving|like[sd]?|enjoy(?:s|ed|ing)?|adore[sd]?|prefer(?:s|red)?|happy|excited|great"
    r"|favou?rite|passionate|fan\s+of|into|fond\s+of|amazing|wonderful|thrilled|proud|rewarding)\b",
    re.IGNORECASE)
_NEGATIVE_RE = re.compile(
    r"\b(?:hate[sd]?|dislike[sd]?|quit|quits|stopp?(?:ed|s)?|gave\s+up|give[s]?\s+up|no\s+longer|bored"
    r"|tired\s+of|sick\s+of|can't\s+stand|regret(?:s|ted)?|unhappy|frustrat\w*|disappoint\w*"
    r"|sad|angry|annoy\w*|awful|terrible|miserable)\b",
    re.IGNORECASE)
_NEGATION_RE = re.compile(r"\b(?:not|never|no\s+longer|don't|doesn't|didn't|isn't|wasn't|won't|can't)\s+"
                          r"(?:\w+\s+)?(?:love|like|enjoy|adore|prefer|happy|excited|into)\b", re.IGNORECASE)
_CHANGE_RE = re.compile(
    r"\b(?:now|no\s+longer|anymore|any\s+more|switched|changed|became|become|becoming|moved|quit|started"
    r"|stopped|new|instead|turned|decided|used\s+to|these\s+days|finally)\b", re.IGNORECASE)
_PREFERENCE_RE = re.compile(
    r"\b(?:love[sd]?|loving|like[sd]?|enjoy(?:s|ed|ing)?|adore[sd]?|prefer(?:s|red)?|favou?rite|passion(?:ate)?"
    r"|fan\s+of|into|fond\s+of|interested\s+in)\b", re.IGNORECASE)
_DATE_RE = re.compile(r"^(?:(Before|After) )?(\d{4}-\d{2}-\d{2})$")
_ACCUM_SIM = 0.3           # token Jaccard of key + content for "similar statements"
_CHANGE_SIM = 0.25         # below this, same-topic states count as different
_MAX_INSIGHTS = 3
_MAX_SHORT_WORDS = 8


def _polarity(text: str) -> int:
    if _NEGATION_RE.search(text) or _NEGATIVE_RE.search(text):
        return -1
    return 1 if _POSITIVE_RE.search(text) else 0


class _Frag:
    __slots__ = ("d", "subject", "category", "key", "content", "date", "side", "tokens", "key_tokens",
                 "entities", "pol")

    def __init__(self, d: dict[str, Any], side: int) -> None:
        self.d = d
        self.subject = str(d.get("subject") or "").strip() or "The user"
        self.category = str(d.get("category") or "")
        self.key = str(d.get("key") or "").strip()
        self.content = str(d.get("content") or "").strip()
        self.date = str(d.get("date") or "").strip()
        self.side = side
        names = {w.lower() for w in self.subject.split()}
        names |= {n + "'s" for n in names}
        self.key_tokens = _content_tokens(self.key, names)
        self.tokens = _content_tokens(f"{self.key} {self.content}", names)
        self.entities = [m.group(1) for m in _CAP_RE.finditer(self.content)
                         if m.group(1) not in _NOT_ENTITY and m.group(1).lower() not in names
                         and m.group(1).lower().removesuffix("'s") not in names]
        self.pol = _polarity(f"{self.key} {self.content}")


def _content_tokens(text: str, exclude: set[str]) -> list[str]:
    out: list[str] = []
    for t in _TOKEN_RE.findall(text.replace("\u2019", "'")):
        low = t.lower().strip("'-").removesuffix("'s")
        if low in exclude or not _is_content(low) or len(low) < 3:
            continue
        if low not in out:
            out.append(low)
    return out


def _jaccard(a: list[str], b: list[str]) -> float:
    if not a or not b:
        return 0.0
    sa, sb = set(a), set(b)
    return len(sa & sb) / len(sa | sb)


def _short(f: _Frag) -> str:
    text = f.content
    if text.lower().startswith(f.subject.lower()):
        text = re.sub(r"^(?:'s\b)?[\s,]*", "", text[len(f.subject):])
    text = re.sub(r"[.!?]+$", "", text).strip()
    words = text.split()
    return " ".join(words[:_MAX_SHORT_WORDS]) + (" ..." if len(words) > _MAX_SHORT_WORDS else "")


def _date_range(frags: list[_Frag]) -> str:
    parsed = []
    for f in frags:
        m = _DATE_RE.match(f.date)
        if m:
            parsed.append((m.group(2), f.date))
    if not parsed:
        return "unknown"
    first = min(parsed)[1]
    last = max(parsed)[1]
    return first if first == last else f"{first} to {last}"[:64]


def _cap_words(text: str, n: int = 20) -> str:
    words = text.split()
    return " ".join(words[:n])


def _by_subject(frags: list[_Frag]) -> dict[str, list[_Frag]]:
    groups: dict[str, list[_Frag]] = {}
    for f in frags:
        groups.setdefault(f.subject, []).append(f)
    return groups


def _key_overlap(a: _Frag, b: _Frag) -> bool:
    if a.key and a.key.lower() == b.key.lower():
        return True
    return _jaccard(a.key_tokens, b.key_tokens) >= 0.5


def _transformation(subject: str, frags: list[_Frag]) -> tuple[dict[str, str], set[int]] | None:
    best: tuple[tuple[int, float, int], _Frag, _Frag] | None = None
    later = [f for f in frags if f.side == 1]
    for i, e in enumerate(f for f in frags if f.side == 0):
        for j, l in enumerate(later):
            sim = _jaccard(e.tokens, l.tokens)
            flip = e.pol * l.pol < 0 and (_key_overlap(e, l) or sim >= 0.15)
            state_change = (_key_overlap(e, l) and sim < _CHANGE_SIM and e.content.lower() != l.content.lower()
                            and _CHANGE_RE.search(l.content) is not None)
            if not (flip or state_change):
                continue
            rank = (0 if flip else 1, sim, i * 10000 + j)
            if best is None or rank < best[0]:
                best = (rank, e, l)
    if best is None:
        return None
    _, e, l = best
    topic = l.key or e.key or "state"
    value = _cap_words(f"{subject} changed from {_short(e)} to {_short(l)}")
    return ({"inference_type": "transformation", "key": f"change in {topic}", "date": _date_range([e, l]),
             "value": value}, {id(e), id(l)})


def _similar(a: _Frag, b: _Frag) -> bool:
    return (bool(a.key) and a.key.lower() == b.key.lower()) or _jaccard(a.tokens, b.tokens) >= _ACCUM_SIM


def _accumulation(subject: str, frags: list[_Frag], exclude: set[int]) -> dict[str, str] | None:
    members: list[_Frag] = []
    best: tuple[float, _Frag, _Frag] | None = None
    earlier = [f for f in frags if f.side == 0]
    later = [f for f in frags if f.side == 1]
    for e in earlier:
        for l in later:
            if id(e) in exclude and id(l) in exclude:
                continue
            same_key = bool(e.key) and e.key.lower() == l.key.lower()
            sim = _jaccard(e.tokens, l.tokens)
            if not _similar(e, l):
                continue
            score = 1.0 + sim if same_key else sim
            if best is None or score > best[0]:
                best = (score, e, l)
            for f in (e, l):
                if f not in members:
                    members.append(f)
    if best is None:
        return None
    for f in frags:             # statements similar to a member, on either side, repeat it too
        if f not in members and any(_similar(f, m) for m in members):
            members.append(f)
    _, e, l = best
    if e.key and e.key.lower() == l.key.lower():
        topic = e.key
    else:
        shared = [t for t in e.tokens if t in l.tokens]
        topic = " ".join(shared[:3]) or e.key
    members.sort(key=lambda f: (f.side, frags.index(f)))
    n = len(members)
    return {"inference_type": "accumulation", "key": f"{topic} (recurring)", "date": _date_range(members),
            "value": _cap_words(f"{subject} repeatedly mentions {topic} ({n} times)")}


def _extension(subject: str, frags: list[_Frag]) -> dict[str, str] | None:
    liked = [s for s in frags
             if s.category == "subjective" and _polarity(s.content) > 0 and _PREFERENCE_RE.search(s.content)]
    for e in frags:
        if e.category != "experiential":
            continue
        for s in liked:
            if s.side == e.side:
                continue
            shared = [t for t in s.key_tokens if t in e.key_tokens]
            if not shared:
                continue
            topic = " ".join(shared[:3])
            beyond = f", beyond {e.key}" if e.key and e.key.lower() != topic else ""
            return {"inference_type": "extension", "key": f"{topic} interest",
                    "date": _date_range([e, s]),
                    "value": _cap_words(f"{subject} has a lasting interest in {topic}{beyond}")}
    return None


def _connection(subject: str, frags: list[_Frag], all_frags: list[_Frag]) -> dict[str, str] | None:
    counts: dict[str, int] = {}
    for f in all_frags:
        for t in f.tokens:
            counts[t] = counts.get(t, 0) + 1
    later = [f for f in frags if f.side == 1]
    for a in (f for f in frags if f.side == 0):
        for b in later:
            if any(t in b.key_tokens for t in a.key_tokens):
                continue            # same topic: accumulation's or transformation's business
            in_keys = set(a.key_tokens) | set(b.key_tokens)
            link = next((x for x in a.entities if x in b.entities and x.lower() not in in_keys), None)
            if link is None:
                link = next((t for t in a.tokens if len(t) >= 5 and counts.get(t) == 2 and t in b.tokens
                             and t not in in_keys), None)
            if link is None:
                continue
            ka, kb = a.key or _short(a), b.key or _short(b)
            if ka.lower() == kb.lower():
                continue
            return {"inference_type": "connection", "key": f"{link} connection",
                    "date": _date_range([a, b]),
                    "value": _cap_words(f"{subject} links {ka} and {kb} through {link}")}
    return None


@rule("reason")
def reason_answer(ctx: dict[str, Any]) -> dict[str, Any]:
    """PREMem step 2 templates over one linked pair (see `memory.prompts.reason_request`)."""
    frags = [_Frag(d, 0) for d in ctx.get("earlier", [])] + [_Frag(d, 1) for d in ctx.get("later", [])]
    insights: list[dict[str, str]] = []
    for subject, group in _by_subject(frags).items():
        if not any(f.side == 0 for f in group) or not any(f.side == 1 for f in group):
            continue
        used: set[int] = set()
        trans = _transformation(subject, group)
        if trans is not None:
            insights.append(trans[0])
            used = trans[1]
        for found in (_accumulation(subject, group, used), _extension(subject, group),
                      _connection(subject, group, frags)):
            if found is not None:
                insights.append(found)
    out: list[dict[str, str]] = []
    seen: set[str] = set()
    for it in insights:
        if it["value"].lower() in seen:
            continue
        seen.add(it["value"].lower())
        out.append(it)
        if len(out) >= _MAX_INSIGHTS:
            break
    return {"extended_insight": out}


# --------------------------------------------------------------------------------------------------
# topics / topic-merge: RMM prospective reflection (Tan et al. §5, Appendix D.1), extractively
# --------------------------------------------------------------------------------------------------
_TOPIC_MIN_TURNS = 3          # no segment shorter than this many turns
_TOPIC_MAX_TURNS = 10         # longer segments are split again at their weakest link
_TOPIC_DEPTH = 0.5            # a breakpoint is a link this many std below the session's mean similarity
_TOPIC_MAX_WORDS = 60


def topic_segments(sims: list[float], n: int) -> list[tuple[int, int]]:
    """[start, end) turn ranges of n turns cut at embedding breakpoints (`memory.segments`): links
    between consecutive turns whose cosine is well below the session's mean, deepest first, keeping
    segments >= _TOPIC_MIN_TURNS; segments over _TOPIC_MAX_TURNS are cut again at their weakest link."""
    if n == 0:
        return []
    if len(sims) != n - 1 or not sims:
        return [(0, n)]
    mean = sum(sims) / len(sims)
    std = (sum((x - mean) ** 2 for x in sims) / len(sims)) ** 0.5
    return breakpoints(sims, mean - _TOPIC_DEPTH * std, _TOPIC_MIN_TURNS, _TOPIC_MAX_TURNS)


@rule("topics")
def topics_answer(ctx: dict[str, Any]) -> dict[str, Any]:
    """RMM D.1.1 for one participant: the session cut into topics at embedding breakpoints
    (`adjacent_sims`); per topic, the participant's personal statements in it, third person,
    referencing the turns they came from. No statement in a segment -> no topic (NO_TRAIT)."""
    turns = ctx.get("turns", [])
    subject = str(ctx.get("subject") or "")
    vocatives = _vocatives(list(ctx.get("participants") or []))
    out = []
    for a, b in topic_segments([float(x) for x in ctx.get("adjacent_sims", [])], len(turns)):
        values: list[str] = []
        refs: list[int] = []
        words = 0
        for t in turns[a:b]:
            if str(t.get("speaker") or "") != subject:
                continue
            for sentence in _statements(str(t.get("text") or ""), vocatives):
                value = third_person(sentence, subject)
                n = len(value.split())
                if words and words + n > _TOPIC_MAX_WORDS:
                    break
                if value.lower() in (v.lower() for v in values):
                    continue
                values.append(value.rstrip(".!") + ".")
                words += n
                if t["turn"] not in refs:
                    refs.append(int(t["turn"]))
        if values:
            out.append({"summary": " ".join(values), "reference": refs})
    return {"extracted_memories": out}


def _merge_text(old: str, new: str) -> str:
    """Extractive merge: the old summary's sentences plus the new ones it lacks, the oldest dropped
    first beyond _TOPIC_MAX_WORDS * 2 words."""
    sents = [s.strip() for s in split_sentences(old) if s.strip()]
    have = {s.lower() for s in sents}
    sents += [s.strip() for s in split_sentences(new) if s.strip() and s.strip().lower() not in have]
    while len(sents) > 1 and sum(len(s.split()) for s in sents) > 2 * _TOPIC_MAX_WORDS:
        sents.pop(0)
    return " ".join(sents)


@rule("topic-merge")
def topic_merge_answer(ctx: dict[str, Any]) -> dict[str, Any]:
    """RMM D.1.2: Merge into the most similar history topic when its cosine (given in the context)
    reaches the threshold, else Add()."""
    hist = ctx.get("history", [])
    if not hist:
        return {"action": "Add()"}
    best = max(range(len(hist)), key=lambda i: (float(hist[i].get("similarity", 0.0)), -i))
    if float(hist[best].get("similarity", 0.0)) < float(ctx.get("threshold", 0.75)):
        return {"action": "Add()"}
    return {"action": f"Merge({best}, {_merge_text(hist[best]['summary'], ctx['new_summary'])})"}


# --------------------------------------------------------------------------------------------------
# MemWeaver cognitive memory: extractive summaries
# --------------------------------------------------------------------------------------------------

def central_order(texts: list[str]) -> list[int]:
    """Indices of `texts`, most central first: the sum of TF-IDF cosines to the other texts
    (ties by position). What the `rules` summaries pick instead of writing prose."""
    import math
    from collections import Counter

    toks = [_content_tokens(t, set()) for t in texts]
    df = Counter(tok for ts in toks for tok in ts)
    n = len(texts)
    vecs = []
    for ts in toks:
        w = {t: math.log((1 + n) / (1 + df[t])) + 1.0 for t in ts}
        norm = math.sqrt(sum(v * v for v in w.values())) or 1.0
        vecs.append({t: v / norm for t, v in w.items()})
    cent = [sum(sum(a.get(t, 0.0) * v for t, v in b.items()) for j, b in enumerate(vecs) if j != i)
            for i, a in enumerate(vecs)]
    return sorted(range(n), key=lambda i: (-cent[i], i))


#: a phase summary quotes about one fragment in eight, between one and five
_SUMMARY_PER = 8
_SUMMARY_MAX = 5


@rule("summarize")
def summarize_answer(ctx: dict[str, Any]) -> dict[str, Any]:
    """Table 4, extractively: the phase's most central fragments, in time order."""
    items = ctx["items"]
    texts = [it["text"] for it in items]
    n_pick = min(_SUMMARY_MAX, max(1, -(-len(texts) // _SUMMARY_PER)))
    picked = sorted(central_order(texts)[:n_pick])
    body = "; ".join(_cap_words(texts[i], 30) for i in picked)
    return {"summary": f"From {ctx['start']} to {ctx['end']}: {body}."}


@rule("profile")
def profile_answer(ctx: dict[str, Any]) -> dict[str, Any]:
    """Table 5, extractively: the most central phase summaries as bullets, oldest first, ≤ 300 words."""
    texts = [s["text"] for s in ctx["summaries"]]
    budget, picked = 290, []
    for i in central_order(texts):
        cost = len(texts[i].split()) + 1
        if cost > budget:
            continue
        picked.append(i)
        budget -= cost
    if not picked and texts:  # one very long summary: cut it
        return {"profile": "- " + " ".join(texts[0].split()[:290])}
    return {"profile": "\n".join("- " + texts[i] for i in sorted(picked)) or "- (no history yet)"}
