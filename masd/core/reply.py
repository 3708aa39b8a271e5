"""The sender's own words of a mail's text: ``reply_text`` (docs/protocol.md §15.2).

The event's ``text`` is the whole body; ``reply_text`` is that text less what
the sender only repeated or appended by habit, so a master, a mode or an
agent reads what is new.  What is removed, all from the sender's last own
line on (profile §21):

* the quoted earlier mail: trailing ``>`` lines, and the attribution that
  introduces them ("On … wrote:", "Am … schrieb …:", "Le … a écrit :", "在 …
  写道：", …), also when a client wrapped it over two or three lines;
* an Outlook or Exchange header block ("-----Original Message-----", or a
  "From:" line followed by "Sent:", "To:", "Subject:" lines, in the same
  languages) and everything after it;
* a forwarded message's marker ("---------- Forwarded message ---------",
  "Begin forwarded message:", …) and everything after it;
* an attribution not followed by ``>`` lines (clients that quote without
  marking the quote) and everything after it;
* the footer a mailing list manager appends (a rule line, then "<list> mailing list"):
  the list's words, not the sender's;
* the signature, from a ``-- `` line on (RFC 3676 §4.3: "-- " alone on a
  line; the trailing space is often lost, so ``--`` counts too), and trailing
  sign-offs of mail clients ("Sent from my iPhone", "Envoyé de mon iPhone",
  "Von meinem iPhone gesendet", "Get Outlook for Android", …).

Kept as written: a quote followed by more of the sender's own words (inline
and bottom posting): only the *trailing* quote goes.  Nothing else is changed.

Two promises hold whatever the input (tests/test_reply.py): the result
equals ``text`` when nothing is removed, and it is never empty while
``text`` holds anything but white space; when the rules above would leave
nothing (a mail that is all quote, a bare forward, only a signature), the
whole text is the reply.  Each line is looked at a bounded number of times:
the work is linear in the text's length.

HTML-only mail is cut in its markup first (:mod:`masd.core.reply_html`), then
its text goes through :func:`reply_text` like any other.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = ["has_words", "own_words", "reply_text"]

# ---------------------------------------------------------------------------
# Attributions: "On <date>, <name> wrote:" and its forms in the languages of
# profile §21.  A line is an attribution when it ends with one of the verbs
# (before its colon), or when it opens with a form's opening word and ends
# with a colon after a date or an address.

_VERBS: Final = (
    r"wrote|writes|said|schrieb|geschrieben|a écrit|a ecrit|escribió|escribio|escreveu"
    r"|ha scritto|scrisse|schreef|heeft geschreven|napisał\(a\)|napisał|napisała|napisal"
    r"|skrev|kirjoitti|написал\(а\)|написал|написала|пишет|писал|пише|написав|написала"
    r"|写道|寫道|のメッセージ|のメール|が書きました"
)
_VERB: Final = re.compile(rf"(?:^|\W)(?:{_VERBS})(?:\W|$)", re.I)
#: the verbs as plain strings: a line's end is compared with str.endswith, far
#: cheaper than a search with the alternation at every position
_VERB_WORDS: Final = tuple(v.replace("\\", "") for v in _VERBS.split("|"))
#: a line opening a wrapped attribution: a date first, or a name and an address
_HEAD: Final = re.compile(r"^\s*(?:\d|.{0,80}<\S*$|.{0,80}@)")
_MAX_ATTRIBUTION: Final = 400
#: the verb and what may follow it fit in a line's last characters (searched alone)
_VERB_TAIL: Final = 40
_OPENERS: Final = r"on|am|le|el|il|op|em|den|dne|w dniu|dnia|в|у|el día|on the|le \w+ \d|在|於|于"
_OPENER: Final = re.compile(rf"^\s*(?:{_OPENERS})\b", re.I)
#: a date, a time or an address: what an attribution names besides its verb
_DATED: Final = re.compile(r"\d{1,2}:\d{2}|\d{4}|@|\d{1,2}[./-]\d{1,2}[./-]\d{2}")
#: Japanese Gmail writes "2019年1月1日(火) 12:00 山田 <yamada@example.jp>:" (no verb)
_ADDRESS_COLON: Final = re.compile(r"<\s*[^<>@\s]+@[^<>\s]+>\s*[:：]\s*$")

# ---------------------------------------------------------------------------
# Outlook and Exchange header blocks.  The first line names the sender; at
# least two more header lines follow within a few lines.

_FROM_NAMES: Final = (
    "from|von|de|da|van|od|från|fra|от|від|від кого|kimden|feladó|lähettäjä"
    "|发件人|發件人|寄件者|寄件人|差出人|보낸 사람"
)
_OTHER_NAMES: Final = (
    "sent|date|to|cc|bcc|subject|reply-to|importance"
    "|gesendet|datum|an|betreff|kopie"
    "|envoyé|envoye|date d'envoi|à|a|objet|cc"
    "|enviado|enviado el|fecha|para|asunto|cco"
    "|inviato|data|oggetto"
    "|verzonden|aan|onderwerp"
    "|enviada|assunto|enviada em"
    "|wysłano|wysłane|wysłany|do|temat|dw"
    "|skickat|till|ämne|kopia"
    "|sendt|dato|til|emne|kopi"
    "|отправлено|дата|кому|тема|копия"
    "|надіслано|відправлено|копія"
    "|发送时间|發送時間|日期|收件人|抄送|主题|主題|傳送時間|收件者|副本|主旨"
    "|送信日時|日付|宛先|件名"
)
_HEADER_LINE: Final = r"^\s*[*_]*\s*(?:{names})\s*[*_]*\s*[:：]"
_FROM_LINE: Final = re.compile(_HEADER_LINE.format(names=_FROM_NAMES), re.I)
_OTHER_LINE: Final = re.compile(_HEADER_LINE.format(names=_OTHER_NAMES), re.I)
_SUBJECT_LINE: Final = re.compile(
    _HEADER_LINE.format(
        names="subject|betreff|objet|asunto|oggetto|onderwerp|assunto|temat|ämne|emne|тема"
        "|主题|主題|主旨|件名|sent|gesendet|envoyé|enviado|inviato|verzonden|enviada|wysłane"
        "|wysłano|skickat|sendt|отправлено|надіслано|відправлено|发送时间|發送時間|傳送時間|送信日時"
    ),
    re.I,
)
#: how many lines after a "From:" line may hold the rest of its block
_BLOCK_WINDOW: Final = 8

# ---------------------------------------------------------------------------
# Separators: "-----Original Message-----" and the forwarded message markers.

#: words of a separator line, lowercase ("urspr": Ursprüngliche in any mangled charset)
_SEPARATOR_STEMS: Final = (
    *("original", "urspr", "origine", "oorspronkelijk", "oryginalna", "ursprungligt"),
    *("opprinnelig", "oprindelig", "alkuperäinen", "исходное", "оригинальное", "пересылаемое"),
    *("переслане", "вихідне", "原始", "元の", "forwarded", "weitergeleitete", "transféré"),
    *("reenviado", "inoltrato", "doorgestuurd", "encaminhada", "reencaminhada", "przekazana"),
    *("vidarebefordrat", "videresendt", "转发", "轉寄", "転送"),
)
_DASHES: Final = " \t*-=_"
#: the words between a separator's dashes are few
_MAX_SEPARATOR: Final = 60
#: a forward's introduction is one short line ending with its colon
_MAX_INTRO: Final = 80
_FORWARD_INTRO: Final = re.compile(
    r"^\s*(?:begin forwarded message|anfang der weitergeleiteten (?:nachricht|e-mail)"
    r"|début du message réexpédié|début du message transféré|inicio del mensaje reenviado"
    r"|comienzo del mensaje reenviado|inizio messaggio inoltrato|begin doorgestuurd bericht"
    r"|início da mensagem reencaminhada|início da mensagem encaminhada|vidarebefordrat brev"
    r"|videresendt meddelelse|videresendt melding|początek przekazywanej wiadomości"
    r"|начало пересылаемого сообщения|转发的邮件|轉寄的郵件|転送されたメッセージ)\s*[:：]?\s*$",
    re.I,
)
#: Outlook Web and mobile draw a line of underscores above their header block
_RULE: Final = re.compile(r"^\s*(?:_{8,}|-{8,}|={8,}|\*{8,})\s*$")

# ---------------------------------------------------------------------------
# Signatures and the sign-offs mail clients append.

#: the mark a mail-tracking extension for Gmail leaves as a last line
_TRACKER: Final = "ᐧ"
_SIG_DELIMITER: Final = re.compile(r"^(?:-- ?|--\s*)$")
_SIGN_OFF: Final = re.compile(
    r"^[\s(<\[*_]*(?:"
    r"(?:sent|envoyé|envoye|enviado|enviada|inviato|verzonden|verstuurd|wysłane|wysłano"
    r"|skickat|sendt|отправлено|надіслано|odesláno|gesendet|get|obtenez|obtener|scarica"
    r"|holen sie sich|download)"
    r"\s+\[?(?:from|with|via|using|by|on|depuis|de|du|von|mit|desde|con|da|met|vanaf|do|dal"
    r"|z|ze|från|med|fra|с|со|з|outlook)\b.{0,90}"
    r"|from my \S.{0,60}"
    r"|(?:von|vom) mein\w*\s.{0,60}(?:gesendet|verschickt)"
    r"|diese nachricht wurde (?:von|mit) .{0,90}(?:gesendet|verschickt)"
    r"|(?:从|從|来自)我的.{0,40}"
    r"|.{0,40}から送信"
    rf"|{_TRACKER}"
    r")[\s.!)>\]*_]*$",
    re.I,
)
#: a sign-off is one short line; up to this many words, "my" stands for a device
_MAX_SIGN_OFF: Final = 120
_SHORT_SIGN_OFF: Final = 8
#: a list footer: a rule and at most this many lines after it
_LIST_FOOTER: Final = 6
_POSSESSIVE: Final = re.compile(
    r"\b(?:my|mon|ma|mein\w*|mi|meu|min|mitt|mijn|mio|mój|mojego|moim|моего|мого)\b|我的",
    re.I,
)
_LIST_NAME: Final = re.compile(r"\bmailing list\b|\bmailinglist\b|\bmailing-list\b", re.I)
_DEVICE: Final = re.compile(
    r"iphone|ipad|ipod|android|mobil|móvil|cell|phone|handy|telefon|téléphone|blackberry"
    r"|samsung|galaxy|huawei|xiaomi|pixel|nokia|htc|outlook|mail|yahoo|aol|device|tablet"
    r"|windows|k-9|airmail|spark|proton|gmail",
    re.I,
)

#: rounds of the trailing rules (a quote under a sign-off under a quote …):
#: real mail needs two or three; the bound keeps hostile text linear
_MAX_ROUNDS: Final = 6
#: how an attribution's line ends ("wrote:", "写道：", Zoho's "wrote ----")
_ENDS: Final = frozenset(":：-")
_QUOTED: Final = re.compile(r"^[ \t]*>")
_CONTINUED: Final = re.compile(rf"^\s*>\s*(?:(?:{_VERBS})\s*)?[:：]\s*$", re.I)
_WORD: Final = re.compile(r"\w")
#: what each cut of :func:`_cut_all` needs in its line: a separator's first character, a
#: forward intro's or an attribution's last (:data:`_ENDS`), a header block's colon
_MARKS: Final = ("-", "=", "_", ":", "：")


def has_words(text: str) -> bool:
    """Whether ``text`` holds anything but white space and punctuation."""
    return _WORD.search(text) is not None


def reply_text(text: str, *, quote_cut: bool = False, from_html: bool = False) -> str:
    """``text`` less its trailing quote, attribution, header block, forward and signature.

    Equal to ``text`` when nothing is removed; the whole text when the rules
    would leave no words while ``text`` has some.  ``quote_cut``: a quote
    followed ``text`` and was cut away (from HTML), so an attribution at its
    end goes too.  ``from_html``: the text was made from HTML whose quote
    marks were already read, so an attribution over unmarked text is no cut."""
    own = own_words(text, quote_cut=quote_cut, from_html=from_html)
    return own if own is not None and has_words(own) else text


def own_words(text: str, *, quote_cut: bool = False, from_html: bool = False) -> str | None:
    """``text`` less what the rules remove (perhaps nothing left), or None when
    they remove nothing."""
    lines = text.split("\n")
    cut = False
    if quote_cut:
        lines = _drop_blank_tail(lines)
        start = _attribution_start(lines, len(lines) - 1) if lines else None
        if start is not None:
            lines, cut = lines[:start], True
    kept = _trim(lines, from_html, dashes=text.startswith("--") or "\n--" in text)
    if kept is None:
        if not cut:
            return None
        kept = lines
    return "\n".join(line.rstrip() for line in kept).strip("\n")


def _trim(lines: list[str], from_html: bool, *, dashes: bool) -> list[str] | None:
    """The lines kept, or None when nothing is removed.  ``dashes``: some line
    starts with ``--`` (else no signature delimiter can be found: every list
    looked at below is a prefix of ``lines``)."""
    whole = _drop_blank_tail(lines)
    end = _cut_all(whole, from_html)
    kept = whole if end == len(whole) else _drop_blank_tail(whole[:end])
    for _ in range(_MAX_ROUNDS):
        before = len(kept)
        unquoted = _drop_quote_tail(kept)
        kept = _drop_list_footer(_drop_sign_offs(_drop_signature(unquoted) if dashes else unquoted))
        if len(kept) == before:
            break
        kept = _drop_blank_tail(kept)
    return None if len(kept) == len(whole) else kept


def _cut_all(lines: list[str], from_html: bool) -> int:
    """Where a header block, a separator, a forward or an unmarked quote begins.

    "and all after it": the first such line found outside quoted lines, below
    some of the sender's own words, ends the reply (a rule line just above it
    goes too).  One above every own word (a mail that opens with a header
    block) is no cut: it is not "from the sender's last own line on"."""
    words = False
    marks = _Marks(lines)
    i = 0
    while i < len(lines):
        line = lines[i]
        # Cheap tests first: this runs on every line of every mail received.
        head = line.lstrip(" \t*")[:1]
        if head and head != ">":
            colon = ":" in line or "：" in line
            end = line.rstrip()[-1:]
            if (
                (head in "-=_" and _is_separator(line))
                or (end in _ENDS and len(line) <= _MAX_INTRO and _FORWARD_INTRO.match(line))
                or (colon and _header_block(lines, i))
            ):
                if words:
                    return _above_rule(lines, i)
                i += 1
                continue  # a marker is nobody's own words
            if not from_html and end in _ENDS and _unmarked_attribution(lines, i):
                start = _attribution_start(lines, i, strong=True) or 0
                if any(has_words(x) for x in lines[:start]):
                    return start
            words = words or has_words(line)
        # Once the sender's words began, a line holding none of the marks changes nothing:
        # every cut above needs one in its own line.
        i = marks.next_marked(i + 1) if words else i + 1
    return len(lines)


class _Marks:
    """Where the lines that hold one of :data:`_MARKS` are, found in the joined text (a
    search in C per such line, not a test in Python per line)."""

    __slots__ = ("_at", "_line", "_lines", "_text")

    def __init__(self, lines: list[str]) -> None:
        self._lines = lines
        self._text: str | None = None
        self._line, self._at = 0, 0  # a line and the offset of its start in _text

    def next_marked(self, i: int) -> int:
        """The first line from ``i`` on holding a mark (``len(lines)``: none)."""
        if self._text is None:
            self._text = "\n".join(self._lines)
        text = self._text
        at = self._start(i)
        found = [p for p in (text.find(m, at) for m in _MARKS) if p >= 0]
        if not found:
            return len(self._lines)
        p = min(found)
        self._line, self._at = i + text.count("\n", at, p), text.rfind("\n", 0, p) + 1
        return self._line

    def _start(self, i: int) -> int:
        """The offset of line ``i`` (at or past the last line found)."""
        while self._line < i:
            self._at += len(self._lines[self._line]) + 1
            self._line += 1
        return self._at


def _is_separator(line: str) -> bool:
    """ "-----Original Message-----", "---------- Forwarded message ---------", …"""
    inner = line.strip(_DASHES)
    return (
        0 < len(inner) <= _MAX_SEPARATOR
        and line.lstrip(" \t*")[1:2] in "-=_"
        and any(stem in inner.lower() for stem in _SEPARATOR_STEMS)
    )


def _above_rule(lines: list[str], i: int) -> int:
    """``i``, or the index of the rule line (blank lines between) just above it."""
    j = i - 1
    while j >= 0 and not lines[j].strip():
        j -= 1
    return j if j >= 0 and _RULE.match(lines[j]) else i


def _header_block(lines: list[str], i: int) -> bool:
    """A "From:" line with two more header lines within the next few lines, one
    of them the subject or the time it was sent (so ``from: Berlin`` / ``to: Paris``
    details are no block)."""
    if not _FROM_LINE.match(lines[i]):
        return False
    found = 0
    subject = False
    for line in lines[i + 1 : i + 1 + _BLOCK_WINDOW]:
        if _OTHER_LINE.match(line):
            found += 1
            subject = subject or bool(_SUBJECT_LINE.match(line))
    return found >= 2 and subject


def _is_attribution(line: str) -> bool:
    """One line (or two or three joined) that introduces a quote."""
    stripped = line.strip()
    if not stripped or len(stripped) > _MAX_ATTRIBUTION:
        return False
    if _verb_end(stripped):
        return True
    if not stripped.endswith((":", "：")) or not _DATED.search(stripped):
        return False
    # "Max <max@example.org> schrieb am Fr., 28. Apr. 2017 um 11:53 Uhr:",
    # "Le 4 janv. 2016 19:03, Neil <neil@example.org> :", "2016-10-24 15:36 Foo <foo@bar>:"
    return bool(_has_verb(stripped) or _OPENER.match(stripped) or _ADDRESS_COLON.search(stripped))


def _has_verb(line: str) -> bool:
    """Whether an attribution's verb is a word of ``line`` (substrings first: cheap)."""
    low = line.lower()
    return any(verb in low for verb in _VERB_WORDS) and _VERB.search(line) is not None


def _verb_end(line: str) -> bool:
    """Whether ``line`` ends with an attribution's verb (a colon or dashes after it)."""
    return line[-_VERB_TAIL:].rstrip(" \t:：-").lower().endswith(_VERB_WORDS)


def _strong_attribution(line: str) -> bool:
    """An attribution sure enough to end the reply with no ``>`` lines after it:
    it names its verb, a date or an address, and opens with a form's opening word
    or names an address."""
    stripped = line.strip()
    return bool(
        len(stripped) <= _MAX_ATTRIBUTION
        and _is_attribution(stripped)
        and _has_verb(stripped)
        and (_OPENER.match(stripped) or "@" in stripped)
        and _DATED.search(stripped)
    )


def _attribution_head(line: str) -> bool:
    """Whether a line can open an attribution wrapped over several lines."""
    return bool(_OPENER.match(line) or _HEAD.match(line) or _has_verb(line))


def _unmarked_attribution(lines: list[str], i: int) -> bool:
    """An attribution ending at ``i`` followed by text that is not marked as quoted."""
    near = " ".join(lines[max(0, i - 2) : i + 1]).lower()
    if not any(verb in near for verb in _VERB_WORDS) or not _is_attribution(lines[i]):
        return False
    if _attribution_start(lines, i, strong=True) is None:
        return False
    nxt = _next_nonblank(lines, i + 1)
    return nxt is not None and not _QUOTED.match(lines[nxt])


def _attribution_start(lines: list[str], end: int, *, strong: bool = False) -> int | None:
    """The first line of the attribution ending at line ``end`` (a client may have
    wrapped it over up to three lines), or None when there is none."""
    test = _strong_attribution if strong else _is_attribution
    for start in (end - 2, end - 1):
        if start < 0 or any(not x.strip() or _QUOTED.match(x) for x in lines[start : end + 1]):
            continue
        if not _attribution_head(lines[start]):
            continue
        if test(" ".join(x.strip() for x in lines[start : end + 1])):
            return start
    return end if test(lines[end]) else None


def _next_nonblank(lines: list[str], i: int) -> int | None:
    while i < len(lines):
        if lines[i].strip():
            return i
        i += 1
    return None


def _drop_blank_tail(lines: list[str]) -> list[str]:
    end = len(lines)
    while end and not lines[end - 1].strip():
        end -= 1
    return lines if end == len(lines) else lines[:end]


def _drop_quote_tail(lines: list[str]) -> list[str]:
    """Without the trailing ``>`` lines and the attribution just above them."""
    end = len(lines)
    while end and (not lines[end - 1].strip() or _QUOTED.match(lines[end - 1])):
        end -= 1
    if end == len(lines) or not any(_QUOTED.match(x) for x in lines[end:]):
        return lines
    # The attribution: the last own line, or it with one or two lines above
    # (clients wrap long "On … wrote:" lines).
    if not end:
        return lines[:end]
    start = _attribution_start(lines, end - 1)
    if start is None and _CONTINUED.match(lines[end]):
        # "… <noreply@example.org" then ">:": the client broke the address's
        # closing bracket onto a line of its own, which now reads as quoted.
        patched = [*lines[: end - 1], lines[end - 1].rstrip() + lines[end].strip()]
        start = _attribution_start(patched, end - 1)
    return lines[: end if start is None else start]


def _drop_signature(lines: list[str]) -> list[str]:
    """Without the signature: from the first ``-- `` line that has own words above it."""
    for i, line in enumerate(lines):
        if not line.startswith("--") or not _SIG_DELIMITER.match(line):
            continue
        if any(has_words(x) for x in lines[:i]):
            return lines[:i]
    return lines


def _drop_sign_offs(lines: list[str]) -> list[str]:
    """Without the mail clients' sign-off lines at the end."""
    end = len(lines)
    while end:
        line = lines[end - 1]
        if not line.strip():
            end -= 1
            continue
        if _is_sign_off(line):
            end -= 1
            continue
        break
    return lines[:end] if end < len(lines) else lines


def _drop_list_footer(lines: list[str]) -> list[str]:
    """Without the footer a mailing list manager appends (Mailman: a rule, "<list>
    mailing list", its address and its page), which is no one's own words."""
    for i in range(max(0, len(lines) - _LIST_FOOTER), len(lines) - 1):
        if lines[i][:1] in "_-=*" and _RULE.match(lines[i]):
            nxt = _next_nonblank(lines, i + 1)
            if nxt is not None and _LIST_NAME.search(lines[nxt]):
                return lines[:i]
    return lines


def _is_sign_off(line: str) -> bool:
    """A client's sign-off: it names a device or a mail program before its first comma
    ("Sent from my cell, please excuse typos"), or is short and says "my" ("Sent from
    my TI-85"); not "Sent by courier today" nor "Sent from my desk, is much easier than
    my mobile phone"."""
    if len(line) > _MAX_SIGN_OFF or not _SIGN_OFF.match(line):
        return False
    if _DEVICE.search(line.split(",")[0]) or line.strip() == _TRACKER:
        return True
    return len(line.split()) <= _SHORT_SIGN_OFF and _POSSESSIVE.search(line) is not None
