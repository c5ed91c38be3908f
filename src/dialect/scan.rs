//! One pass over a request body: checks that it is JSON and picks out the envelope fields,
//! borrowed, without building any value. serde_json's generic skipping was most of a small
//! request's cost; here a skipped value is walked with a byte table and nothing else.
//!
//! What counts as JSON is what serde_json accepts: RFC 8259 grammar, no control characters in
//! strings, valid escapes. Like serde_json when it skips a value, strings that are only skipped
//! are not checked for UTF-8 and skipped values may nest without limit (the walk keeps its own
//! stack, so depth costs no recursion); keys and the fields the router reads are checked.

use std::borrow::Cow;
use std::ops::Range;

use super::RequestEnvelope;

/// The body is not JSON: the scan stopped at byte `at`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotJson {
    pub at: usize,
}

impl std::fmt::Display for NotJson {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "not JSON at byte {}", self.at)
    }
}

impl std::error::Error for NotJson {}

/// Where the scan failed is read from the scanner once, at the top.
#[derive(Debug)]
struct Invalid;

type Scan<T> = Result<T, Invalid>;

/// Bytes that end a run of plain string content: the quote, the backslash, control characters.
static STRING_STOP: [bool; 256] = {
    let mut table = [false; 256];
    let mut c = 0;
    while c < 0x20 {
        table[c] = true;
        c += 1;
    }
    table[b'"' as usize] = true;
    table[b'\\' as usize] = true;
    table
};

/// Where the first quote, backslash or control character in `bytes` is, and whether every
/// byte before it is ASCII (then the string needs no UTF-8 check). Sixteen bytes at a time:
/// long strings (uploads, documents) are most of a large body, and a short one is one step.
#[cfg(target_arch = "x86_64")]
#[inline]
fn plain_run(bytes: &[u8]) -> Option<(usize, bool)> {
    use std::arch::x86_64::{
        __m128i, _mm_cmpeq_epi8, _mm_loadu_si128, _mm_min_epu8, _mm_movemask_epi8, _mm_or_si128, _mm_set1_epi8,
    };
    let mut at = 0;
    // High bits seen so far: a byte over 0x7f.
    let mut high = 0;
    while at + 16 <= bytes.len() {
        // SAFETY: SSE2 is part of every x86_64 CPU; the load is unaligned and reads
        // `bytes[at..at + 16]`, which the loop condition keeps in bounds.
        let (stops, highs) = unsafe {
            let x = _mm_loadu_si128(bytes.as_ptr().add(at).cast::<__m128i>());
            let control = _mm_cmpeq_epi8(_mm_min_epu8(x, _mm_set1_epi8(0x1f)), x);
            let quote = _mm_cmpeq_epi8(x, _mm_set1_epi8(b'"' as i8));
            let backslash = _mm_cmpeq_epi8(x, _mm_set1_epi8(b'\\' as i8));
            let stop = _mm_or_si128(control, _mm_or_si128(quote, backslash));
            (_mm_movemask_epi8(stop) as u32, _mm_movemask_epi8(x) as u32)
        };
        if stops != 0 {
            let n = stops.trailing_zeros();
            high |= highs & ((1 << n) - 1);
            return Some((at + n as usize, high == 0));
        }
        high |= highs;
        at += 16;
    }
    plain_tail(&bytes[at..], high == 0).map(|(n, ascii)| (at + n, ascii))
}

/// [`plain_run`] elsewhere: eight bytes at a time in a `u64`.
#[cfg(not(target_arch = "x86_64"))]
use plain_run_swar as plain_run;

/// [`plain_run`] without SIMD instructions (tested on every target).
#[cfg(any(test, not(target_arch = "x86_64")))]
#[inline]
fn plain_run_swar(bytes: &[u8]) -> Option<(usize, bool)> {
    const ONES: u64 = u64::MAX / 255;
    const HIGH: u64 = ONES * 0x80;
    // A byte of `x` is zero, or below `n`: the lowest flagged byte is exact (Bit Twiddling
    // Hacks, "determine if a word has a byte less than n").
    let below = |x: u64, n: u64| x.wrapping_sub(ONES * n) & !x & HIGH;
    let mut at = 0;
    let mut high = 0;
    while let Some(chunk) = bytes.get(at..at + 8) {
        let w = u64::from_le_bytes(chunk.try_into().expect("eight bytes"));
        let stop = below(w, 0x20) | below(w ^ (ONES * u64::from(b'"')), 1) | below(w ^ (ONES * u64::from(b'\\')), 1);
        if stop != 0 {
            let n = stop.trailing_zeros() / 8;
            high |= w & HIGH & ((1 << (8 * n)) - 1);
            return Some((at + n as usize, high == 0));
        }
        high |= w & HIGH;
        at += 8;
    }
    plain_tail(&bytes[at..], high == 0).map(|(n, ascii)| (at + n, ascii))
}

/// The end of [`plain_run`], a byte at a time; `ascii` says whether what came before was.
#[inline]
fn plain_tail(bytes: &[u8], mut ascii: bool) -> Option<(usize, bool)> {
    for (n, &c) in bytes.iter().enumerate() {
        if STRING_STOP[c as usize] {
            return Some((n, ascii));
        }
        ascii &= c.is_ascii();
    }
    None
}

/// Reads `body` as a JSON-RPC request (or batch: its first element) and returns its envelope.
pub fn request<'a>(body: &'a [u8], body_field: &str) -> Result<RequestEnvelope<'a>, NotJson> {
    scan_request(body, body_field, false).map(|scan| scan.envelope)
}

/// [`request`], and the envelope's `params.name` (a name that is not a string, or will not
/// decode, is none: it is only logged and traced, no reason to refuse a request).
pub fn request_named<'a>(
    body: &'a [u8],
    body_field: &str,
) -> Result<(RequestEnvelope<'a>, Option<Cow<'a, str>>), NotJson> {
    let scan = scan_request(body, body_field, true)?;
    Ok((scan.envelope, scan.name.and_then(|n| n.value().ok())))
}

/// Where the envelope's `params.requestState` literal (quotes included) sits in `body`.
pub fn request_state_at(body: &[u8], body_field: &str) -> Option<Range<usize>> {
    scan_request(body, body_field, false).ok()?.state_at
}

/// Where the envelope's `params.taskId` literal (quotes included) sits in `body`.
pub fn task_id_at(body: &[u8], body_field: &str) -> Option<Range<usize>> {
    scan_request(body, body_field, false).ok()?.task_at
}

/// What one scan finds: the envelope, and beside it (kept out of the envelope, which every
/// request moves around) where its `params.requestState` literal sits, for the rare request
/// that needs it, and `params.name` when asked for.
struct Scanned<'a> {
    envelope: RequestEnvelope<'a>,
    state_at: Option<Range<usize>>,
    task_at: Option<Range<usize>>,
    name: Option<RawStr<'a>>,
}

fn scan_request<'a>(body: &'a [u8], body_field: &str, want_name: bool) -> Result<Scanned<'a>, NotJson> {
    let mut s = Scanner {
        b: body,
        i: 0,
        state_at: None,
        task_at: None,
        want_name,
        name: None,
    };
    let scan = |s: &mut Scanner<'a>| {
        s.ws();
        let envelope = s.envelope(body_field.as_bytes())?;
        s.ws();
        match s.i == body.len() {
            true => Ok(envelope),
            false => Err(Invalid),
        }
    };
    match scan(&mut s) {
        Ok(envelope) => Ok(Scanned {
            envelope,
            state_at: s.state_at,
            task_at: s.task_at,
            name: s.name,
        }),
        Err(Invalid) => Err(NotJson { at: s.i }),
    }
}

/// What a string's literal holds, as far as reading its value goes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Text {
    /// ASCII only, no escapes: the literal is the value.
    Ascii,
    /// Bytes over 0x7f, no escapes: the value once checked as UTF-8.
    Unchecked,
    /// Escapes to decode.
    Escaped,
}

/// A string token: its literal (quotes included), and what it holds.
#[derive(Clone, Copy)]
struct RawStr<'a> {
    quoted: &'a [u8],
    text: Text,
}

impl<'a> RawStr<'a> {
    fn inner(self) -> &'a [u8] {
        &self.quoted[1..self.quoted.len() - 1]
    }

    /// The string's value: borrowed unless it has escapes.
    fn value(self) -> Scan<Cow<'a, str>> {
        match self.text {
            // SAFETY: ASCII is UTF-8; the scan saw every byte of the literal.
            Text::Ascii => Ok(Cow::Borrowed(unsafe { std::str::from_utf8_unchecked(self.inner()) })),
            Text::Unchecked => std::str::from_utf8(self.inner())
                .map(Cow::Borrowed)
                .map_err(|_| Invalid),
            // Rare: serde_json decodes the escapes and checks surrogate pairs.
            Text::Escaped => serde_json::from_slice::<String>(self.quoted)
                .map(Cow::Owned)
                .map_err(|_| Invalid),
        }
    }

    /// The string as a key to compare: escapes decoded, UTF-8 checked (serde_json checks the
    /// keys of the objects it reads). Plain ASCII, the usual key, needs neither.
    fn key(self) -> Scan<Cow<'a, [u8]>> {
        match self.text {
            Text::Ascii => Ok(Cow::Borrowed(self.inner())),
            Text::Unchecked => std::str::from_utf8(self.inner())
                .map(|_| Cow::Borrowed(self.inner()))
                .map_err(|_| Invalid),
            Text::Escaped => self.value().map(|k| Cow::Owned(k.into_owned().into_bytes())),
        }
    }
}

/// A key field as found: a number's text, or a string still to decode.
enum KeyText<'a> {
    Number(&'a str),
    String(RawStr<'a>),
}

struct Scanner<'a> {
    b: &'a [u8],
    i: usize,
    /// Where the request object's `params.requestState` literal sits, once read.
    state_at: Option<Range<usize>>,
    task_at: Option<Range<usize>>,
    /// Whether `params.name` is read, and the request object's, once read.
    want_name: bool,
    name: Option<RawStr<'a>>,
}

impl<'a> Scanner<'a> {
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    fn ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.i += 1;
        }
    }

    fn eat(&mut self, c: u8) -> Scan<()> {
        match self.peek() == Some(c) {
            true => {
                self.i += 1;
                Ok(())
            }
            false => Err(Invalid),
        }
    }

    /// The top-level value: an object's envelope, a batch's first element's, else none.
    fn envelope(&mut self, field: &[u8]) -> Scan<RequestEnvelope<'a>> {
        match self.peek() {
            Some(b'{') => self.envelope_object(field),
            Some(b'[') => {
                let mut first = None;
                self.array(|s| {
                    match (&first, s.peek()) {
                        (None, Some(b'{')) => first = Some(s.envelope_object(field)?),
                        (None, _) => {
                            first = Some(RequestEnvelope::default());
                            s.value()?
                        }
                        _ => s.value()?,
                    }
                    Ok(())
                })?;
                Ok(first.unwrap_or_default())
            }
            _ => self.value().map(|()| RequestEnvelope::default()),
        }
    }

    /// A request object. Fields are decoded once, at the end: the last occurrence of a key
    /// is the one that counts, so an earlier one that would not decode does not matter.
    fn envelope_object(&mut self, field: &[u8]) -> Scan<RequestEnvelope<'a>> {
        let mut id = None;
        let (mut method, mut message_id, mut request_state, mut task_id) = (None, None, None, None);
        let mut name = None;
        self.object(|s, key| {
            match &*key.key()? {
                b"id" => id = Some(s.raw_text()?),
                b"method" => method = s.string_field()?,
                b"params" => {
                    // A later `params` replaces an earlier one whole.
                    (request_state, task_id, name) = (None, None, None);
                    match s.peek() {
                        Some(b'{') => s.object(|s, key| {
                            match &*key.key()? {
                                b"requestState" => request_state = s.string_field()?,
                                b"taskId" => task_id = s.string_field()?,
                                b"name" if s.want_name => name = s.string_field()?,
                                _ => s.value()?,
                            }
                            Ok(())
                        })?,
                        _ => s.value()?,
                    }
                }
                k if k == field => message_id = s.key_field()?,
                _ => s.value()?,
            }
            Ok(())
        })?;
        self.state_at = request_state.map(|r| super::span_in(self.b, r.quoted));
        self.task_at = task_id.map(|r| super::span_in(self.b, r.quoted));
        self.name = name;
        let decode = |raw: Option<RawStr<'a>>| raw.map(RawStr::value).transpose();
        Ok(RequestEnvelope {
            id,
            method: decode(method)?,
            message_id: match message_id {
                Some(KeyText::Number(n)) => Some(Cow::Borrowed(n)),
                Some(KeyText::String(s)) => Some(s.value()?),
                None => None,
            },
            request_state: decode(request_state)?,
            task_id: decode(task_id)?,
        })
    }

    /// Skips one value, however deeply nested, keeping the open containers on its own stack.
    fn value(&mut self) -> Scan<()> {
        let mut open = Containers::default();
        loop {
            // A value starts here.
            match self.peek().ok_or(Invalid)? {
                b'"' => self.skip_string().map(drop)?,
                opening @ (b'{' | b'[') => {
                    let object = opening == b'{';
                    if !self.enter(object)? {
                        open.push(object);
                        if object {
                            self.member_key()?;
                        }
                        continue;
                    }
                }
                b't' => self.literal(b"true")?,
                b'f' => self.literal(b"false")?,
                b'n' => self.literal(b"null")?,
                b'-' | b'0'..=b'9' => self.number()?,
                _ => return Err(Invalid),
            }
            // A value ended: close containers until one has a next member.
            loop {
                let Some(in_object) = open.top() else {
                    return Ok(());
                };
                self.ws();
                match (self.peek(), in_object) {
                    (Some(b','), _) => {
                        self.i += 1;
                        self.ws();
                        if in_object {
                            self.member_key()?;
                        }
                        break;
                    }
                    (Some(b'}'), true) | (Some(b']'), false) => {
                        self.i += 1;
                        open.pop();
                    }
                    _ => return Err(Invalid),
                }
            }
        }
    }

    /// A member's key and colon, up to its value.
    #[inline(always)]
    fn member_key(&mut self) -> Scan<()> {
        self.skip_string()?;
        self.ws();
        self.eat(b':')?;
        self.ws();
        Ok(())
    }

    /// Skips one value and returns its text, which must be UTF-8 (serde_json's `RawValue`).
    fn raw_text(&mut self) -> Scan<&'a str> {
        let start = self.i;
        self.value()?;
        std::str::from_utf8(&self.b[start..self.i]).map_err(|_| Invalid)
    }

    /// A field read only when it is a string (decoded later).
    fn string_field(&mut self) -> Scan<Option<RawStr<'a>>> {
        match self.peek() {
            Some(b'"') => self.string().map(Some),
            _ => self.raw_text().map(|_| None),
        }
    }

    /// A key field: a string as is, a number by its JSON text; anything else is no key.
    fn key_field(&mut self) -> Scan<Option<KeyText<'a>>> {
        match self.peek() {
            Some(b'-' | b'0'..=b'9') => self.raw_text().map(|t| Some(KeyText::Number(t))),
            _ => Ok(self.string_field()?.map(KeyText::String)),
        }
    }

    /// Walks an object; `member` gets each key and must consume its value.
    fn object(&mut self, mut member: impl FnMut(&mut Self, RawStr<'a>) -> Scan<()>) -> Scan<()> {
        if self.enter(true)? {
            return Ok(());
        }
        loop {
            let key = self.string()?;
            self.ws();
            self.eat(b':')?;
            self.ws();
            member(self, key)?;
            if self.close(b'}')? {
                return Ok(());
            }
        }
    }

    /// Walks an array; `element` must consume each element.
    fn array(&mut self, mut element: impl FnMut(&mut Self) -> Scan<()>) -> Scan<()> {
        if self.enter(false)? {
            return Ok(());
        }
        loop {
            element(self)?;
            if self.close(b']')? {
                return Ok(());
            }
        }
    }

    /// Steps into an object or array at its opening bracket; `true` if it is empty (and so
    /// already left).
    fn enter(&mut self, object: bool) -> Scan<bool> {
        let (opening, closing) = if object { (b'{', b'}') } else { (b'[', b']') };
        self.eat(opening)?;
        self.ws();
        let empty = self.peek() == Some(closing);
        if empty {
            self.i += 1;
        }
        Ok(empty)
    }

    /// After a member or element: `true` at the container's end, `false` after a comma.
    fn close(&mut self, end: u8) -> Scan<bool> {
        self.ws();
        match self.peek() {
            Some(b',') => {
                self.i += 1;
                self.ws();
                Ok(false)
            }
            Some(c) if c == end => {
                self.i += 1;
                Ok(true)
            }
            _ => Err(Invalid),
        }
    }

    /// A string, from its opening quote.
    fn string(&mut self) -> Scan<RawStr<'a>> {
        let start = self.i;
        let text = self.skip_string()?;
        Ok(RawStr {
            quoted: &self.b[start..self.i],
            text,
        })
    }

    /// Skips a string, from its opening quote; says what it holds. Most strings end at the
    /// first stop byte.
    #[inline(always)]
    fn skip_string(&mut self) -> Scan<Text> {
        let b = self.b;
        if b.get(self.i) != Some(&b'"') {
            return Err(Invalid);
        }
        let (run, ascii) = plain_run(&b[self.i + 1..]).ok_or(Invalid)?;
        let end = self.i + 1 + run;
        match b[end] {
            b'"' => {
                self.i = end + 1;
                Ok(if ascii { Text::Ascii } else { Text::Unchecked })
            }
            _ => {
                self.i = end;
                self.rest_of_escaped_string()
            }
        }
    }

    /// The rest of a string from its first backslash (or control character, refused).
    #[cold]
    fn rest_of_escaped_string(&mut self) -> Scan<Text> {
        loop {
            match self.b[self.i] {
                b'"' => {
                    self.i += 1;
                    return Ok(Text::Escaped);
                }
                b'\\' => {
                    self.i += 1;
                    self.escape()?;
                }
                _ => return Err(Invalid),
            }
            self.i += plain_run(&self.b[self.i..]).ok_or(Invalid)?.0;
        }
    }

    /// The rest of an escape, after its backslash. Like serde_json when skipping, a `\u`
    /// needs four hex digits; surrogates are checked only where the value is decoded.
    fn escape(&mut self) -> Scan<()> {
        match self.peek().ok_or(Invalid)? {
            b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => {
                self.i += 1;
                Ok(())
            }
            b'u' => {
                let hex = self.b.get(self.i + 1..self.i + 5).ok_or(Invalid)?;
                match hex.iter().all(u8::is_ascii_hexdigit) {
                    true => {
                        self.i += 5;
                        Ok(())
                    }
                    false => Err(Invalid),
                }
            }
            _ => Err(Invalid),
        }
    }

    fn literal(&mut self, word: &[u8]) -> Scan<()> {
        match self.b[self.i..].starts_with(word) {
            true => {
                self.i += word.len();
                Ok(())
            }
            false => Err(Invalid),
        }
    }

    /// `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`
    fn number(&mut self) -> Scan<()> {
        if self.peek() == Some(b'-') {
            self.i += 1;
        }
        match self.peek() {
            Some(b'0') => self.i += 1,
            Some(b'1'..=b'9') => self.digits(),
            _ => return Err(Invalid),
        }
        if self.peek() == Some(b'.') {
            self.i += 1;
            self.some_digits()?;
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.i += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.i += 1;
            }
            self.some_digits()?;
        }
        Ok(())
    }

    fn digits(&mut self) {
        while let Some(b'0'..=b'9') = self.peek() {
            self.i += 1;
        }
    }

    fn some_digits(&mut self) -> Scan<()> {
        let start = self.i;
        self.digits();
        match self.i > start {
            true => Ok(()),
            false => Err(Invalid),
        }
    }
}

/// The containers a skipped value has open: `true` for an object. The first 64 levels live
/// in a bit set; deeper ones (rare, bounded by the body size) spill to the heap.
#[derive(Default)]
struct Containers {
    bits: u64,
    depth: usize,
    deeper: Vec<bool>,
}

impl Containers {
    fn push(&mut self, object: bool) {
        match self.depth < 64 {
            true => self.bits = (self.bits & !(1 << self.depth)) | (u64::from(object) << self.depth),
            false => self.deeper.push(object),
        }
        self.depth += 1;
    }

    fn pop(&mut self) {
        self.depth -= 1;
        if self.depth >= 64 {
            self.deeper.pop();
        }
    }

    fn top(&self) -> Option<bool> {
        match self.depth {
            0 => None,
            d if d <= 64 => Some(self.bits >> (d - 1) & 1 == 1),
            _ => self.deeper.last().copied(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_run_finds_the_first_stop_byte_at_every_offset() {
        let naive = |b: &[u8]| {
            let stop = b.iter().position(|&c| STRING_STOP[c as usize])?;
            Some((stop, b[..stop].is_ascii()))
        };
        // Filler with bytes just above and below each stop value, and UTF-8 above 0x7f.
        let filler = [b'a', b'!', b'#', b'[', b']', 0x20, 0x7f, 0x80, 0xc3, 0xff];
        for len in 0..70 {
            for (n, fill) in filler.iter().enumerate() {
                let mut bytes: Vec<u8> = (0..len).map(|i| filler[(i + n) % filler.len()].max(*fill)).collect();
                assert_eq!(plain_run(&bytes), naive(&bytes), "{bytes:?}");
                assert_eq!(plain_run_swar(&bytes), naive(&bytes), "{bytes:?}");
                for at in 0..len {
                    for stop in [b'"', b'\\', 0x00, 0x01, 0x1f] {
                        let keep = bytes[at];
                        bytes[at] = stop;
                        assert_eq!(plain_run(&bytes), naive(&bytes), "{bytes:?}");
                        assert_eq!(plain_run_swar(&bytes), naive(&bytes), "{bytes:?}");
                        bytes[at] = keep;
                    }
                }
            }
        }
    }
}
