//! The lock file `[catalog] lock` names: the tool definitions an operator approved, by
//! fingerprint (docs/src/catalog.md). `mrtr-router catalog lock` writes it from what the fleet
//! serves; read with the config (and again on reload), so that `check` judges it too.
//!
//! ```toml
//! [tools]
//! search = "9f2c…" # 64 hex digits: the SHA-256 of the definition's canonical form
//! ```

use std::collections::BTreeMap;

/// A definition's fingerprint: the SHA-256 of its canonical form (`catalog::Fingerprint`).
pub type Fingerprint = [u8; 32];

/// Approved definitions, by tool name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Lock {
    pub tools: BTreeMap<String, Fingerprint>,
}

impl Lock {
    /// Reads a lock file's text.
    pub fn parse(text: &str) -> Result<Lock, String> {
        let table: toml::Table = text.parse().map_err(|e: toml::de::Error| e.message().to_string())?;
        let mut tools = BTreeMap::new();
        for (key, value) in table {
            let toml::Value::Table(entries) = value else {
                return Err(format!("`{key}`: only a [tools] table belongs in a lock file"));
            };
            if key != "tools" {
                return Err(format!("[{key}]: only a [tools] table belongs in a lock file"));
            }
            for (tool, fingerprint) in entries {
                let text = fingerprint
                    .as_str()
                    .ok_or_else(|| format!("tools.{tool}: a fingerprint is a string of 64 hex digits"))?;
                let parsed = parse_hex(text).ok_or_else(|| format!("tools.{tool}: {text:?} is not 64 hex digits"))?;
                tools.insert(tool, parsed);
            }
        }
        Ok(Lock { tools })
    }

    /// The file's text: a comment saying what it is, then `[tools]` in name order.
    pub fn render(&self) -> String {
        let mut out = String::from(
            "# Approved tool definitions, written by `mrtr-router catalog lock`: with `[catalog] lock`\n\
             # naming this file, a call of a tool goes only to backends serving the definition below,\n\
             # and is refused 409 `tool_definition_changed` when none does (docs: \"Tools across the fleet\").\n",
        );
        let tools: toml::Table = self
            .tools
            .iter()
            .map(|(tool, fingerprint)| (tool.clone(), toml::Value::String(hex(fingerprint))))
            .collect();
        let mut table = toml::Table::new();
        table.insert("tools".into(), toml::Value::Table(tools));
        // `[tools]`, its keys escaped as TOML escapes them.
        out.push_str(&table.to_string());
        out
    }

    /// Whether `fingerprint` is the approved definition of `tool` (a tool the lock does not
    /// name is not approved).
    pub fn approves(&self, tool: &str, fingerprint: &Fingerprint) -> bool {
        self.tools.get(tool) == Some(fingerprint)
    }
}

/// 32 bytes as 64 hex digits.
pub fn hex(fingerprint: &Fingerprint) -> String {
    fingerprint.iter().map(|b| format!("{b:02x}")).collect()
}

fn parse_hex(text: &str) -> Option<Fingerprint> {
    if text.len() != 64 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_reads_back_what_it_wrote() {
        let mut lock = Lock::default();
        lock.tools.insert("search".into(), [1; 32]);
        lock.tools.insert("odd \"name\"\n".into(), [2; 32]);
        let text = lock.render();
        assert_eq!(Lock::parse(&text).unwrap(), lock);
        assert!(lock.approves("search", &[1; 32]));
        assert!(!lock.approves("search", &[2; 32]));
        assert!(!lock.approves("other", &[1; 32]));
    }

    #[test]
    fn a_lock_that_is_no_lock_is_refused() {
        for bad in [
            "[tools]\nx = 1",
            "[tools]\nx = \"abc\"",
            "x = \"00\"",
            "[other]\nx = \"00\"",
            "[tools",
        ] {
            assert!(Lock::parse(bad).is_err(), "{bad}");
        }
    }
}
