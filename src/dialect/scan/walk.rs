//! The byte-level walk under the scan: JSON as serde_json accepts it, one index moved over the
//! body's bytes, strings found sixteen bytes at a time, skipped values walked with a byte table
//! and a stack of their own. Knows JSON, and nothing of requests or envelopes (the scan reads
//! those from what the walk finds).

use std::borrow::Cow;

/// A string that does not decode; where it sits is for its reader to say.
#[derive(Debug)]
pub(super) struct Invalid;

pub(super) type Scan<T> = Result<T, Invalid>;

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

/// What a string's literal holds, as far as reading its value goes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Text {
    /// ASCII only, no escapes: the literal is the value.
    Ascii,
    /// Bytes over 0x7f, no escapes, checked as UTF-8 by the walk: the literal is the value.
    Utf8,
    /// Escapes to decode.
    Escaped,
}

/// A string as the walk found it: its literal (quotes included), and what it holds.
#[derive(Clone, Copy)]
pub(super) struct RawStr<'a> {
    pub quoted: &'a [u8],
    pub text: Text,
}

impl<'a> RawStr<'a> {
    fn inner(self) -> &'a [u8] {
        &self.quoted[1..self.quoted.len() - 1]
    }

    /// The string's value: borrowed unless it has escapes.
    pub fn value(self) -> Scan<Cow<'a, str>> {
        match self.text {
            // SAFETY: ASCII is UTF-8, and a literal with other bytes was checked as UTF-8 by the
            // walk (`string_end`); the scan saw every byte of the literal.
            Text::Ascii | Text::Utf8 => Ok(Cow::Borrowed(unsafe { std::str::from_utf8_unchecked(self.inner()) })),
            // Rare: serde_json decodes the escapes and checks surrogate pairs.
            Text::Escaped => serde_json::from_slice::<String>(self.quoted)
                .map(Cow::Owned)
                .map_err(|_| Invalid),
        }
    }

    /// The string as a key to compare: escapes decoded, UTF-8 checked (serde_json checks the
    /// keys of the objects it reads). Plain ASCII, the usual key, needs neither.
    pub fn key(self) -> Scan<Cow<'a, [u8]>> {
        match self.text {
            Text::Ascii | Text::Utf8 => Ok(Cow::Borrowed(self.inner())),
            Text::Escaped => self.value().map(|k| Cow::Owned(k.into_owned().into_bytes())),
        }
    }
}

/// A key field as found: a number's text, or a string still to decode.
pub(super) enum KeyText<'a> {
    Number(&'a str),
    String(RawStr<'a>),
}

// The walk. Every step takes the body and the index it starts at, and returns the index just
// past what it read, or the index where the body stopped being JSON. Free functions over a
// plain index, not methods on a scanner: the index can live in a register rather than behind
// `&mut self` (11% fewer instructions for a 300-byte `tools/call`).

/// Where a step failed, or where it ended.
pub(super) type At<T> = Result<T, usize>;

/// The first index at or after `i` that is not whitespace.
#[inline(always)]
pub(super) fn ws(b: &[u8], mut i: usize) -> usize {
    while let Some(b' ' | b'\t' | b'\n' | b'\r') = b.get(i) {
        i += 1;
    }
    i
}

/// `i`, if the byte there is `c`.
#[inline(always)]
fn expect(b: &[u8], i: usize, c: u8) -> At<usize> {
    match b.get(i) == Some(&c) {
        true => Ok(i),
        false => Err(i),
    }
}

/// Walks an object from its `{` at `i`; `member` gets each key and the index of its value,
/// and returns the index past the value.
#[inline(always)]
pub(super) fn object<'a>(b: &'a [u8], i: usize, mut member: impl FnMut(RawStr<'a>, usize) -> At<usize>) -> At<usize> {
    let mut i = ws(b, i + 1);
    if b.get(i) == Some(&b'}') {
        return Ok(i + 1);
    }
    loop {
        let (end, text) = string_end(b, expect(b, i, b'"')?)?;
        let key = RawStr {
            quoted: &b[i..end],
            text,
        };
        let colon = expect(b, ws(b, end), b':')?;
        i = ws(b, member(key, ws(b, colon + 1))?);
        match b.get(i) {
            Some(b',') => i = ws(b, i + 1),
            Some(b'}') => return Ok(i + 1),
            _ => return Err(i),
        }
    }
}

/// Walks an array from its `[` at `i`; `element` gets the index of each element and returns
/// the index past it.
pub(super) fn array(b: &[u8], i: usize, mut element: impl FnMut(usize) -> At<usize>) -> At<usize> {
    let mut i = ws(b, i + 1);
    if b.get(i) == Some(&b']') {
        return Ok(i + 1);
    }
    loop {
        i = ws(b, element(i)?);
        match b.get(i) {
            Some(b',') => i = ws(b, i + 1),
            Some(b']') => return Ok(i + 1),
            _ => return Err(i),
        }
    }
}

/// Skips the value at `i` and returns its text, which must be UTF-8 (serde_json's `RawValue`).
pub(super) fn raw_text(b: &[u8], i: usize) -> At<(usize, &str)> {
    let end = skip(b, i)?;
    // Mostly a number (an `id`): ASCII.
    match crate::dialect::text(&b[i..end]) {
        Some(text) => Ok((end, text)),
        None => Err(end),
    }
}

/// A field read only when it is a string (decoded later): `into` is set to it, or to none.
#[inline(always)]
pub(super) fn string_field<'a>(b: &'a [u8], i: usize, into: &mut Option<RawStr<'a>>) -> At<usize> {
    match b.get(i) {
        Some(b'"') => {
            let (end, text) = string_end(b, i)?;
            *into = Some(RawStr {
                quoted: &b[i..end],
                text,
            });
            Ok(end)
        }
        _ => {
            *into = None;
            raw_text(b, i).map(|(end, _)| end)
        }
    }
}

/// A key field: a string as is, a number by its JSON text; anything else is no key.
pub(super) fn key_field(b: &[u8], i: usize) -> At<(usize, Option<KeyText<'_>>)> {
    match b.get(i) {
        Some(b'-' | b'0'..=b'9') => raw_text(b, i).map(|(end, text)| (end, Some(KeyText::Number(text)))),
        _ => {
            let mut found = None;
            let end = string_field(b, i, &mut found)?;
            Ok((end, found.map(KeyText::String)))
        }
    }
}

/// Skips the value at `i`, however deeply nested, keeping the open containers on its own
/// stack; returns the index past it.
pub(super) fn skip(b: &[u8], mut i: usize) -> At<usize> {
    let mut open = Containers::default();
    // Whether the innermost open container is an object (none open: the value is done).
    let mut top = None;
    loop {
        // A value starts at `i`.
        match *b.get(i).ok_or(i)? {
            b'"' => i = string_end(b, i)?.0,
            opening @ (b'{' | b'[') => {
                let object = opening == b'{';
                i = ws(b, i + 1);
                // `}` and `]` are two past `{` and `[`.
                if b.get(i) != Some(&(opening + 2)) {
                    open.push(object);
                    top = Some(object);
                    if object {
                        i = member_key(b, i)?;
                    }
                    continue;
                }
                i += 1;
            }
            b't' => i = literal_end(b, i, b"true")?,
            b'f' => i = literal_end(b, i, b"false")?,
            b'n' => i = literal_end(b, i, b"null")?,
            b'-' | b'0'..=b'9' => i = number_end(b, i)?,
            _ => return Err(i),
        }
        // A value ended: close containers until one has a next member.
        loop {
            let Some(in_object) = top else {
                return Ok(i);
            };
            i = ws(b, i);
            match b.get(i) {
                Some(b',') => {
                    i = ws(b, i + 1);
                    if in_object {
                        i = member_key(b, i)?;
                    }
                    break;
                }
                Some(b'}') if in_object => {
                    i += 1;
                    top = open.pop();
                }
                Some(b']') if !in_object => {
                    i += 1;
                    top = open.pop();
                }
                _ => return Err(i),
            }
        }
    }
}

/// A member's key and colon, from the key's quote at `i`; returns the index of its value.
#[inline(always)]
fn member_key(b: &[u8], i: usize) -> At<usize> {
    let (end, _) = string_end(b, expect(b, i, b'"')?)?;
    let colon = expect(b, ws(b, end), b':')?;
    Ok(ws(b, colon + 1))
}

/// The end of the string whose opening quote is at `i` (the index past its closing quote), and
/// what it holds. Most strings end at the first stop byte. Every string is checked as UTF-8,
/// skipped or read: a body whose bytes a backend could decode another way is no JSON (an ASCII
/// string, the usual, needs no check).
#[inline(always)]
fn string_end(b: &[u8], i: usize) -> At<(usize, Text)> {
    let (run, ascii) = plain_run(&b[i + 1..]).ok_or(i)?;
    let end = i + 1 + run;
    match b[end] {
        b'"' if ascii => Ok((end + 1, Text::Ascii)),
        b'"' => utf8(b, i, end).map(|_| (end + 1, Text::Utf8)),
        _ => escaped_string_end(b, end).and_then(|close| utf8(b, i, close - 1).map(|_| (close, Text::Escaped))),
    }
}

/// Whether the literal's bytes between its quote at `open` and its closing quote at `close` are
/// UTF-8 (escapes are ASCII: they change nothing of it).
#[cold]
fn utf8(b: &[u8], open: usize, close: usize) -> At<()> {
    match std::str::from_utf8(&b[open + 1..close]) {
        Ok(_) => Ok(()),
        Err(e) => Err(open + 1 + e.valid_up_to()),
    }
}

/// The rest of a string from its first backslash (or control character, refused) at `i`.
#[cold]
fn escaped_string_end(b: &[u8], mut i: usize) -> At<usize> {
    loop {
        match b[i] {
            b'"' => return Ok(i + 1),
            b'\\' => i = escape_end(b, i + 1)?,
            _ => return Err(i),
        }
        i += plain_run(&b[i..]).ok_or(i)?.0;
    }
}

/// The rest of an escape, after its backslash at `i - 1`. Like serde_json when skipping, a
/// `\u` needs four hex digits; surrogates are checked only where the value is decoded.
fn escape_end(b: &[u8], i: usize) -> At<usize> {
    match b.get(i) {
        Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => Ok(i + 1),
        Some(b'u') => match b.get(i + 1..i + 5) {
            Some(hex) if hex.iter().all(u8::is_ascii_hexdigit) => Ok(i + 5),
            _ => Err(i),
        },
        _ => Err(i),
    }
}

fn literal_end(b: &[u8], i: usize, word: &[u8]) -> At<usize> {
    match b[i..].starts_with(word) {
        true => Ok(i + word.len()),
        false => Err(i),
    }
}

/// `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`, from `i`.
fn number_end(b: &[u8], mut i: usize) -> At<usize> {
    if b.get(i) == Some(&b'-') {
        i += 1;
    }
    match b.get(i) {
        Some(b'0') => i += 1,
        Some(b'1'..=b'9') => i = digits_end(b, i + 1),
        _ => return Err(i),
    }
    if b.get(i) == Some(&b'.') {
        i = some_digits_end(b, i + 1)?;
    }
    if let Some(b'e' | b'E') = b.get(i) {
        i += 1;
        if let Some(b'+' | b'-') = b.get(i) {
            i += 1;
        }
        i = some_digits_end(b, i)?;
    }
    Ok(i)
}

fn digits_end(b: &[u8], mut i: usize) -> usize {
    while let Some(b'0'..=b'9') = b.get(i) {
        i += 1;
    }
    i
}

/// At least one digit from `i`.
fn some_digits_end(b: &[u8], i: usize) -> At<usize> {
    match digits_end(b, i) {
        end if end > i => Ok(end),
        _ => Err(i),
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

    /// Closes the innermost container; says what the one around it is, if any.
    fn pop(&mut self) -> Option<bool> {
        self.depth -= 1;
        if self.depth >= 64 {
            self.deeper.pop();
        }
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
