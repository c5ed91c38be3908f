//! What "printable" means for a name the router shows (a backend's, a tool's in a metric label):
//! no character that renders as nothing or moves the text around it.

/// Whether `ch` renders as itself: not a control character, not a format character (bidi
/// overrides and isolates, zero-width ones, the byte-order mark, tags), not a separator other
/// than the plain space (no-break and wide spaces, line and paragraph separators).
pub fn printable_char(ch: char) -> bool {
    !(ch.is_control()
        || matches!(
            ch,
            '\u{00A0}'
                | '\u{1680}'
                | '\u{2000}'..='\u{200A}'
                | '\u{202F}'
                | '\u{205F}'
                | '\u{3000}'
                | '\u{00AD}'
                | '\u{0600}'..='\u{0605}'
                | '\u{061C}'
                | '\u{06DD}'
                | '\u{070F}'
                | '\u{180E}'
                | '\u{200B}'..='\u{200F}'
                | '\u{2028}'..='\u{202E}'
                | '\u{2060}'..='\u{2064}'
                | '\u{2066}'..='\u{206F}'
                | '\u{FEFF}'
                | '\u{FFF9}'..='\u{FFFB}'
                | '\u{110BD}'
                | '\u{1D173}'..='\u{1D17A}'
                | '\u{E0001}'
                | '\u{E0020}'..='\u{E007F}'
        ))
}

/// Whether every character of `name` is printable.
pub fn printable(name: &str) -> bool {
    name.chars().all(printable_char)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_hide_or_reorder_text_are_not_printable() {
        assert!(printable("w1-eu.west_2 résumé 検索"));
        for bad in [
            "a\u{202E}b",
            "a\u{2028}b",
            "a\u{200B}b",
            "a\u{FEFF}",
            "a\rb",
            "\u{E0041}",
            "a\u{2066}b",
        ] {
            assert!(!printable(bad), "{bad:?}");
        }
    }
}
