"""Sentence heuristics shared by the consolidation stages and the `rules` backend.

Deterministic, English-only, regex based:

* :func:`categorize`: PREMem's category of a statement ("factual", "experiential", "subjective")
  from cue words (PREMem Figure 3 keywords, extended) and the tense of its time expression.
* :func:`third_person`: first-person singular references rewritten as a named subject.
* :func:`key_phrase`: a short key (2-4 content words) for a statement.
* :func:`split_sentences`: a regex sentence split on . ! ? and line breaks, not after "Dr." etc.
* :func:`is_content`, :func:`content_tokens`: content-word tests (stopwords, pronouns, cue verbs,
  time words and past participles are not content); :func:`cap_words`: the first n words.
* :data:`TOKEN_RE`, :data:`CAPITALIZED_RE`, :data:`NOT_ENTITY`: word tokens, capitalized words that
  may name an entity, and the capitalized words that never do.
* :func:`turn_text`: what a turn's vector embeds.
* :func:`prose`: a message without its code blocks (statements are not read from code).
"""
from __future__ import annotations

import re
import textwrap
from collections.abc import Iterable
from functools import lru_cache
from typing import Any

from markdown_it import MarkdownIt

from memory.dates import time_match
from memory.lexicon import IRREGULAR_PAST

__all__ = ["turn_text", "said_by", "cites_only", "prose", "looks_like_code", "ROLE_SPEAKERS", "categorize", "third_person", "key_phrase", "split_sentences", "is_content", "content_tokens",
           "cap_words", "TOKEN_RE", "CAPITALIZED_RE", "NOT_ENTITY"]


#: chat-template role names (case-insensitive): a speaker that names no one
ROLE_SPEAKERS = frozenset({"user", "assistant", "system", "human", "ai", "bot", "model", "tool"})


def turn_text(speaker: str | None, text: str | None) -> str:
    """What a turn's vector embeds: ``speaker: text`` when the speaker is a name (questions name
    people: "what did Caroline adopt?"), the text alone when it is a chat role, a word that says
    nothing about the content (BEAM 100K dense Recall@10 0.573 -> 0.603 without it)."""
    who = (speaker or "").strip()
    return text or "" if not who or who.lower() in ROLE_SPEAKERS else f"{who}: {text or ''}"


def said_by(messages: Iterable[dict[str, Any]], voices: Iterable[str]) -> set[str]:
    """Ids of the `messages` (rows with `message_id` and `speaker`) one of `voices` said (speaker
    names, case-insensitive: `RetrievalSettings.assistant_speakers`)."""
    wanted = {v.lower() for v in voices}
    return {m["message_id"] for m in messages if str(m.get("speaker") or "").lower() in wanted} if wanted else set()


def cites_only(sources: Iterable[str] | None, said: set[str]) -> bool:
    """Does a memory citing `sources` cite nothing but the turns `said` (an assistant's advice)?"""
    cited = set(sources or ())
    return bool(cited) and cited <= said


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

_SENT_SPLIT_RE = re.compile(r"(?<=[.!?])[\"')\]]*\s+|\n+")
# no splitter installed (nltk, pysbd, spaCy): none after a title, vs., e.g., i.e., an initial after a name before a capital
# (John F. Kennedy) or before an initial (J. K.; not "C and F. We"), etc. or U.S., a.m. before a lowercase word or digit
_ABBREV_RE = re.compile(r"(?:\b(?:Mrs?|Ms|Dr|St|Jr|Sr|Prof|Mt|vs|e\.g|i\.e)|(?P<named>(?:\b[A-Z][a-z]+|(?<![\w.])[A-Z]\.)\s[A-HJ-Z])"
                        r"|(?P<bare>(?<![\w.])[A-HJ-Z])|(?P<lower>\betc|(?<![\w.])(?:[A-Za-z]\.)+[A-Za-z]))\.$")
CAPITALIZED_RE = re.compile(r"(?<![.!?]\s)(?<!^)\b([A-Z][A-Za-z]+|[A-Z]{2,}[A-Za-z+]*)")
TOKEN_RE = re.compile(r"[A-Za-z][A-Za-z'\-+]*|\d+")
NOT_ENTITY = _words("""I I'm I've I'll I'd The A An And But So My We Our It This That Mom Dad OK Ok Okay
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
were are aren't had did used didn't can't couldn't won't wouldn't shouldn't wasn't weren't hadn't mustn't
too myself and or but as so to in at on for with a an the of that if when because who sort kind
mean guess""")
# past forms and participles; not "bit", which is mostly "a bit"
_PAST_SET = (frozenset(IRREGULAR_PAST) - {"bit"}) | _words("quit let hit cut been gone done seen")
_CONJ_MAP = {"am": "is", "have": "has", "do": "does", "don't": "doesn't", "haven't": "hasn't",
             "go": "goes", "ain't": "isn't", "'m": "is"}


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


#: "Emma and I", "my wife and I", "you and I" opening a clause: a plural subject, whose verb stays
_WITH_I_RE = re.compile(r"(?:^|[,;:(]\s*|\b(?:when|because|so|but|since|that|while|after|before|then)\s+)"
                        r"(?P<np>(?:[Mm]y|[Oo]ur|[Tt]he|[Hh]is|[Hh]er|[Tt]heir|[Yy]our|[Yy]ou|[Hh]e|[Ss]he|[A-Z][a-z]+)(?:\s+[A-Za-z'-]+){0,2})\s+and\s+$")
_NOT_IN_NP = _words("i we they it is am are was were be been has have had do does did not to on in at of for with from into about by this that so")


def _with_i(before: str) -> bool:
    """Does `before` end with "<noun phrase> and " that makes the next "I" part of a plural subject?"""
    m = _WITH_I_RE.search(before)
    return m is not None and not any(w in _NOT_IN_NP or w in _PAST_SET or w.endswith(("ed", "n't"))
                                     for w in m.group("np").lower().split()[1:])   # no function word, no verb


def third_person(sentence: str, subject: str) -> str:
    """Rewrite first-person singular references as the `subject` in the third person.

    I -> Subject (with the verb agreed: "I love" -> "Subject loves", "I have" -> "Subject has"),
    I'm -> Subject is, I've -> Subject has, I'll -> Subject will, I'd -> Subject would (had before a
    participle), my/mine -> Subject's, me -> Subject, myself -> themself. "we"/"our" are left as they are,
    and so is the verb of a plural subject ("Emma and I are" -> "Emma and Subject are", I've -> have).
    """
    name = subject.strip() or "The speaker"

    def i_sub(m: re.Match[str]) -> str:
        contr = (m.group("contr") or "").lower().replace("\u2019", "'")
        adv = m.group("adv") or ""
        verb = m.group("verb")
        tail = f" {verb}" if verb else ""
        if contr == "'m":
            return f"{name} is{adv}{tail}"
        plural = _with_i(m.string[:m.start()])
        if contr == "'ve":
            return f"{name} {'have' if plural else 'has'}{adv}{tail}"
        if contr == "'ll":
            return f"{name} will{adv}{tail}"
        if contr == "'d":
            aux = "had" if verb and (verb.lower() in ("been", "gone", "done", "seen", "never")
                                     or verb.lower().endswith("ed")) else "would"
            return f"{name} {aux}{adv}{tail}"
        if verb is None:
            return name
        return f"{name}{adv} {verb if plural else _conjugate(verb)}"

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


def is_content(tok: str) -> bool:
    """Is `tok` a content word (not a stopword, pronoun, contraction, number or past participle)?"""
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
    toks = TOKEN_RE.findall(sentence.replace("\u2019", "'"))
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
        if tok and is_content(tok):
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
@lru_cache(maxsize=1)
def _markdown() -> MarkdownIt:
    return MarkdownIt("commonmark").disable(["inline", "text_join"])   # blocks are all it needs: 4x faster


#: where an indented code block can start (four spaces, or a tab after at most three)
_INDENTED_RE = re.compile(r"(?m)^(?: {4}| {0,3}\t)")


#: longer texts are parsed each time they are read, not cached (a message may hold 1M characters)
_PROSE_CACHE_CHARS = 20_000


def prose(text: str) -> str:
    """`text` without its Markdown code blocks (fenced or indented), found by markdown-it's block
    parser: pasted code is not something its speaker says about themselves, and split by lines it
    became one "statement" per line (42 % of a BEAM 100K chat's fragments were code lines). Line
    breaks are normalized to \\n first (the only ones the parser counts), then the indentation every
    line shares is removed and the text stripped: a message's own indentation is not a code block.
    Cached up to `_PROSE_CACHE_CHARS`: extraction and the supersede stage each read a message."""
    return _cached_prose(text) if len(text) <= _PROSE_CACHE_CHARS else _prose(text)


@lru_cache(maxsize=4096)
def _cached_prose(text: str) -> str:
    return _prose(text)


def _prose(text: str) -> str:
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = textwrap.dedent(text).strip()
    if "```" not in text and "~~~" not in text and not _INDENTED_RE.search(text):
        return text             # no code block can start: skip the parse
    lines = text.split("\n")
    drop = [False] * len(lines)
    for tok in _markdown().parse(text):
        if tok.type in ("fence", "code_block") and tok.map:
            for i in range(tok.map[0], min(tok.map[1], len(lines))):
                drop[i] = True
    return "\n".join(line for line, gone in zip(lines, drop) if not gone)


def split_sentences(text: str) -> list[str]:
    """Regex sentence split on . ! ? and line breaks, not after an abbreviation (`_ABBREV_RE`)."""
    out, start = [], 0
    for m in _SENT_SPLIT_RE.finditer(text):
        ab = None if "\n" in m.group() else _ABBREV_RE.search(text, max(start, m.start() - 20), m.start())
        nxt = text[m.end():m.end() + 2]
        if not ab or not (nxt[:1].islower() or nxt[:1].isdigit() if ab["lower"] else nxt[:1].isupper()
                          and (ab["bare"] is None or nxt[1:] == ".") if ab["named"] or ab["bare"] else True):
            out.append(text[start:m.start()])
            start = m.end()
    return [s.strip() for s in out + [text[start:]] if s.strip()]


def content_tokens(text: str, exclude: set[str]) -> list[str]:
    """The distinct content words of `text`, lower-cased, in order, without those in `exclude`."""
    out: list[str] = []
    for t in TOKEN_RE.findall(text.replace("\u2019", "'")):
        low = t.lower().strip("'-").removesuffix("'s")
        if low in exclude or not is_content(low) or len(low) < 3:
            continue
        if low not in out:
            out.append(low)
    return out


def cap_words(text: str, n: int = 20) -> str:
    """The first `n` words of `text`."""
    words = text.split()
    return " ".join(words[:n])


#: what marks a line of code or markup rather than a sentence (code blocks are left out before,
#: `prose`): assignment, brace, bracket, backtick, emphasis and table-pipe signs; a call (``fetch(``,
#: not a plural ``friend(s)``); a comparison with a number (``age > 30``, not an arrow ``->``); a
#: tag; an error line; a code keyword opening the line; a heading, a quote or a list label. A
#: parenthesis after a space and a ``#`` inside a line are prose (``to $500 (from $400)``, ``C#``).
_CODE_LINE_RE = re.compile(
    r"[={}\[\]`|*]|\w\((?!e?s\))|(?<![-=<>])[<>]=?\s*-?\d|</?[A-Za-z][^>]*>"
    r"|\b[A-Z]\w*(?:Error|Exception)\b:|^\s*Traceback\b"
    r"|^\s*(?:def|class|import|return|from\s+\S+\s+import)\s|^\s*(?:SELECT|INSERT|UPDATE|DELETE|CREATE)\s"
    r"|^\s*[#>]|^\s*[-\d]+[.)]\s")


def looks_like_code(text: str) -> bool:
    """Does `text` read as a line of code or markup rather than a sentence (`_CODE_LINE_RE`)?"""
    return _CODE_LINE_RE.search(text) is not None
