//! Reading the TOML document key by key. Each key is declared once, in the function that reads
//! its section: name, type, default and bounds in one call, which checks the value (errors name
//! the file, the line and `section.key`) and records its effective value for `check`'s printout.

use std::fmt::Write;
use std::net::SocketAddr;
use std::ops::{Range, RangeInclusive};
use std::path::{Path, PathBuf};
use std::time::Duration;

use toml::de::{DeTable, DeValue};
use toml::Spanned;

use super::{defaults, ConfigError};

/// The document being read: where errors point, and the printout of every key read so far.
pub(super) struct Doc<'t> {
    file: &'t Path,
    text: &'t str,
    /// The effective configuration as TOML, section by section in reading order.
    printout: String,
}

impl<'t> Doc<'t> {
    pub fn new(file: &'t Path, text: &'t str) -> Doc<'t> {
        Doc {
            file,
            text,
            printout: String::new(),
        }
    }

    /// The document's tables, or the TOML syntax error.
    pub fn tables(&self) -> Result<Spanned<DeTable<'t>>, ConfigError> {
        DeTable::parse(self.text).or_else(|e| self.err(e.span(), e.message()))
    }

    pub fn into_printout(self) -> String {
        self.printout
    }

    pub fn err<T>(&self, span: Option<Range<usize>>, message: impl Into<String>) -> Result<T, ConfigError> {
        let line = span.map(|s| self.text[..s.start.min(self.text.len())].matches('\n').count() + 1);
        Err(ConfigError {
            file: self.file.to_path_buf(),
            line,
            message: message.into(),
        })
    }

    /// A file the config names: a relative path is taken from the config file's directory.
    pub fn resolve(&self, path: &str) -> PathBuf {
        self.file.parent().unwrap_or(Path::new("")).join(path.trim())
    }

    /// Rejects top-level keys that are no section the router knows.
    pub fn only_sections(&self, root: &DeTable<'t>, known: &[&str]) -> Result<(), ConfigError> {
        match root.iter().find(|(k, _)| !known.contains(&k.get_ref().as_ref())) {
            Some((k, _)) => self.err(
                Some(k.span()),
                format!(
                    "unknown section `{}` (expected one of: {})",
                    k.get_ref(),
                    known.join(", ")
                ),
            ),
            None => Ok(()),
        }
    }

    /// The section `name`, if the document has it (a table).
    pub fn section<'a>(
        &'a mut self,
        root: &'a DeTable<'t>,
        name: &'static str,
    ) -> Result<Section<'a, 't>, ConfigError> {
        let value = root.get(name);
        let table = match value.map(|v| (v.get_ref(), v.span())) {
            None => None,
            Some((DeValue::Table(t), span)) => Some((t, span)),
            Some((_, span)) => return self.err(Some(span), format!("{name}: must be a table ([{name}])")),
        };
        Ok(Section::new(self, name, table, false))
    }

    /// The elements of the array of tables `name` (`[[name]]`), each read as a section.
    pub fn tables_of<'a>(
        &self,
        root: &'a DeTable<'t>,
        name: &'static str,
    ) -> Result<Vec<(&'a DeTable<'t>, Range<usize>)>, ConfigError> {
        let Some(value) = root.get(name) else {
            return Ok(Vec::new());
        };
        let DeValue::Array(items) = value.get_ref() else {
            return self.err(
                Some(value.span()),
                format!("{name}: must be an array of tables ([[{name}]])"),
            );
        };
        items
            .iter()
            .map(|item| match item.get_ref() {
                DeValue::Table(t) => Ok((t, item.span())),
                _ => self.err(
                    Some(item.span()),
                    format!("{name}: must be an array of tables ([[{name}]])"),
                ),
            })
            .collect()
    }
}

/// One section being read. [`Section::finish`] rejects the keys nobody asked for and appends
/// the section's printout to the document's.
pub(super) struct Section<'a, 't> {
    doc: &'a mut Doc<'t>,
    name: &'static str,
    table: Option<&'a DeTable<'t>>,
    span: Option<Range<usize>>,
    /// `[[name]]` rather than `[name]`.
    array: bool,
    read: Vec<&'static str>,
    printout: String,
}

/// An array of strings as written, with where the array stands.
pub(super) type TextList<'a> = (Vec<Text<'a>>, Range<usize>);

/// A string value as written, with where it stands (for checks made after reading).
pub(super) struct Text<'a> {
    pub value: &'a str,
    pub span: Option<Range<usize>>,
}

impl<'a, 't> Section<'a, 't> {
    fn new(
        doc: &'a mut Doc<'t>,
        name: &'static str,
        table: Option<(&'a DeTable<'t>, Range<usize>)>,
        array: bool,
    ) -> Self {
        Section {
            doc,
            name,
            span: table.as_ref().map(|(_, s)| s.clone()),
            table: table.map(|(t, _)| t),
            array,
            read: Vec::new(),
            printout: String::new(),
        }
    }

    /// An element of an array of tables (`[[name]]`).
    pub fn element(doc: &'a mut Doc<'t>, name: &'static str, table: &'a DeTable<'t>, span: Range<usize>) -> Self {
        Section::new(doc, name, Some((table, span)), true)
    }

    /// Whether the document has this section.
    pub fn present(&self) -> bool {
        self.table.is_some()
    }

    /// Where the section stands (its header), for errors about it as a whole.
    pub fn span(&self) -> Option<Range<usize>> {
        self.span.clone()
    }

    pub fn err<T>(&self, span: Option<Range<usize>>, message: impl Into<String>) -> Result<T, ConfigError> {
        self.doc.err(span, message)
    }

    pub fn doc(&self) -> &Doc<'t> {
        self.doc
    }

    /// `section.key`, as errors name it.
    pub fn key_name(&self, key: &str) -> String {
        format!("{}.{key}", self.name)
    }

    fn value(&mut self, key: &'static str) -> Option<&'a Spanned<DeValue<'t>>> {
        self.read.push(key);
        self.table.and_then(|t| t.get(key))
    }

    fn wrong_type<T>(&self, key: &str, v: &Spanned<DeValue<'t>>, expected: &str) -> Result<T, ConfigError> {
        self.err(Some(v.span()), format!("{}: expected {expected}", self.key_name(key)))
    }

    /// Records `key = value` (a TOML value, already written as TOML) in the printout.
    pub fn print(&mut self, key: &str, toml_value: impl std::fmt::Display) {
        let _ = writeln!(self.printout, "{key} = {toml_value}");
    }

    /// Adds a `# comment` line to the printout (what an unset optional key means).
    pub fn print_comment(&mut self, comment: &str) {
        let _ = writeln!(self.printout, "# {comment}");
    }

    /// A string, or `None` when the key is absent. Not printed: the caller prints what it made of it.
    pub fn text(&mut self, key: &'static str) -> Result<Option<Text<'a>>, ConfigError> {
        match self.value(key) {
            None => Ok(None),
            Some(v) => match v.get_ref() {
                DeValue::String(s) => Ok(Some(Text {
                    value: s.as_ref(),
                    span: Some(v.span()),
                })),
                _ => self.wrong_type(key, v, "a string"),
            },
        }
    }

    /// A string with a default, printed.
    pub fn string(&mut self, key: &'static str, default: &str) -> Result<(String, Option<Range<usize>>), ConfigError> {
        let (value, span) = match self.text(key)? {
            Some(t) => (t.value.to_string(), t.span),
            None => (default.to_string(), None),
        };
        self.print(key, quoted(&value));
        Ok((value, span))
    }

    /// An integer within `range`, printed.
    pub fn int(&mut self, key: &'static str, default: i64, range: RangeInclusive<i64>) -> Result<i64, ConfigError> {
        let n = match self.value(key) {
            None => default,
            Some(v) => {
                let n = match v.get_ref() {
                    DeValue::Integer(i) => i64::from_str_radix(i.as_str(), i.radix()).ok(),
                    _ => None,
                };
                let Some(n) = n else {
                    return self.wrong_type(key, v, "an integer");
                };
                if !range.contains(&n) {
                    let (min, max) = (range.start(), range.end());
                    return self.err(
                        Some(v.span()),
                        format!("{}: {n} is out of range {min}..={max}", self.key_name(key)),
                    );
                }
                n
            }
        };
        self.print(key, n);
        Ok(n)
    }

    /// `true` or `false`, or `None` when the key is absent. Not printed.
    pub fn maybe_flag(&mut self, key: &'static str) -> Result<Option<bool>, ConfigError> {
        match self.value(key) {
            None => Ok(None),
            Some(v) => match v.get_ref() {
                DeValue::Boolean(b) => Ok(Some(*b)),
                _ => self.wrong_type(key, v, "true or false"),
            },
        }
    }

    /// `true` or `false` with a default, printed.
    pub fn flag(&mut self, key: &'static str, default: bool) -> Result<bool, ConfigError> {
        let b = self.maybe_flag(key)?.unwrap_or(default);
        self.print(key, b);
        Ok(b)
    }

    /// A number (integer or float) that passes `valid`, else `rule` is the error; printed.
    pub fn float(
        &mut self,
        key: &'static str,
        default: f64,
        valid: impl Fn(f64) -> bool,
        rule: &str,
    ) -> Result<f64, ConfigError> {
        let x = match self.value(key) {
            None => default,
            Some(v) => {
                let x = match v.get_ref() {
                    DeValue::Float(f) => f.as_str().parse::<f64>().ok(),
                    DeValue::Integer(i) => i64::from_str_radix(i.as_str(), i.radix()).ok().map(|n| n as f64),
                    _ => None,
                };
                let Some(x) = x else {
                    return self.wrong_type(key, v, "a number");
                };
                if !valid(x) {
                    return self.err(Some(v.span()), format!("{}: {rule}", self.key_name(key)));
                }
                x
            }
        };
        self.print(key, toml::Value::Float(x));
        Ok(x)
    }

    /// A duration like `"10s"`, `"5m"`: greater than zero, at most [`defaults::MAX_DURATION`]; printed.
    pub fn duration(&mut self, key: &'static str, default: Duration) -> Result<Duration, ConfigError> {
        let d = match self.text(key)? {
            None => default,
            Some(t) => {
                let name = self.key_name(key);
                match humantime::parse_duration(t.value.trim()) {
                    Ok(d) if d.is_zero() => return self.err(t.span, format!("{name}: must be greater than zero")),
                    Ok(d) if d > defaults::MAX_DURATION => {
                        return self.err(t.span, format!("{name}: at most {} days", defaults::MAX_DURATION_DAYS))
                    }
                    Ok(d) => d,
                    Err(e) => {
                        return self.err(
                            t.span,
                            format!(
                                "{name}: invalid duration {:?} ({e}); use e.g. \"10s\", \"5m\", \"1h\"",
                                t.value
                            ),
                        )
                    }
                }
            }
        };
        self.print(key, quoted(&humantime::format_duration(d).to_string()));
        Ok(d)
    }

    /// An `IP:port` socket address; printed.
    pub fn addr(
        &mut self,
        key: &'static str,
        default: &str,
    ) -> Result<(SocketAddr, Option<Range<usize>>), ConfigError> {
        let (text, span) = match self.text(key)? {
            Some(t) => (t.value, t.span),
            None => (default, None),
        };
        let Ok(addr) = text.parse::<SocketAddr>() else {
            return self.err(
                span,
                format!("{}: {text:?} is not an IP:port address", self.key_name(key)),
            );
        };
        self.print(key, quoted(&addr.to_string()));
        Ok((addr, span))
    }

    /// One of `choices` by name; printed.
    pub fn choice<T: Copy>(
        &mut self,
        key: &'static str,
        default: &str,
        choices: &[(&str, T)],
    ) -> Result<T, ConfigError> {
        let (name, span) = match self.text(key)? {
            Some(t) => (t.value, t.span),
            None => (default, None),
        };
        let Some((name, value)) = choices.iter().find(|(n, _)| *n == name) else {
            let names: Vec<&str> = choices.iter().map(|(n, _)| *n).collect();
            return self.err(
                span,
                format!("{}: {name:?} is not one of {}", self.key_name(key), names.join(", ")),
            );
        };
        self.print(key, quoted(name));
        Ok(*value)
    }

    /// A boolean (`true` or `false`); printed.
    pub fn bool(&mut self, key: &'static str, default: bool) -> Result<bool, ConfigError> {
        let b = match self.value(key) {
            None => default,
            Some(v) => match v.get_ref() {
                DeValue::Boolean(b) => *b,
                _ => return self.wrong_type(key, v, "true or false"),
            },
        };
        self.print(key, b);
        Ok(b)
    }

    /// An array of strings, with where each stands; not printed.
    pub fn strings(&mut self, key: &'static str) -> Result<Option<TextList<'a>>, ConfigError> {
        let Some(v) = self.value(key) else { return Ok(None) };
        let DeValue::Array(items) = v.get_ref() else {
            return self.wrong_type(key, v, "an array of strings");
        };
        let mut out = Vec::with_capacity(items.len());
        for item in items.iter() {
            match item.get_ref() {
                DeValue::String(s) => out.push(Text {
                    value: s.as_ref(),
                    span: Some(item.span()),
                }),
                _ => return self.wrong_type(key, item, "an array of strings"),
            }
        }
        Ok(Some((out, v.span())))
    }

    /// Rejects keys no reader asked for, and adds the section to the printout (a section absent
    /// from the file is printed with its defaults when `print_absent`).
    pub fn finish(self, print_absent: bool) -> Result<(), ConfigError> {
        if let Some(table) = self.table {
            if let Some((k, _)) = table.iter().find(|(k, _)| !self.read.contains(&k.get_ref().as_ref())) {
                return self.doc.err(
                    Some(k.span()),
                    format!(
                        "{}: unknown key `{}` (expected one of: {})",
                        self.name,
                        k.get_ref(),
                        self.read.join(", ")
                    ),
                );
            }
        }
        if self.table.is_some() || print_absent {
            let out = &mut self.doc.printout;
            if !out.is_empty() {
                out.push('\n');
            }
            let _ = match self.array {
                true => writeln!(out, "[[{}]]", self.name),
                false => writeln!(out, "[{}]", self.name),
            };
            out.push_str(&self.printout);
        }
        Ok(())
    }
}

/// `text` as a TOML string, escaped as TOML needs.
pub(super) fn quoted(text: &str) -> String {
    toml::Value::String(text.to_string()).to_string()
}
