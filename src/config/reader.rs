//! Reading the TOML document key by key. Each key is declared once, beside the function that
//! reads its section (in it, or, for the long sections `[auth]` and `[quotas]`, as constants in
//! their folder's `keys.rs`): [`key`] names it and says what it means. It is read once, by a
//! call that gives its type, default and bounds and checks the value (errors name the file,
//! the line and `section.key`), and that call records the effective value for `check`'s
//! printout and, in reference mode, the key's entry in the reference (`mrtr-router config
//! reference`, `config example`).
//!
//! Adding a section: read it in `Config::read` with `doc.section(root, "name", "what it is")`
//! (or `doc.elements` for an array of tables), in a function of its own file that reads every
//! key with one of [`Section`]'s typed readers, e.g.
//! `s.int(key("max_rounds", "rounds one call may take"), default, 1..=1000)?`, and ends with
//! `s.finish(..)`. That is all: the reference, the example config and `check` follow from it.
//! A [`key`] cannot be written without its meaning; keys without a default also say what
//! leaving them out means ([`Key::unset`]) and give an example ([`Key::example`]).
//!
//! In reference mode ([`Doc::reference`]) every section is present and empty, an array of
//! tables has one empty element, a required key reads its example and `${VAR}` a placeholder,
//! so every key is read and documented. A section reader must therefore read all its keys
//! whatever the values read before (read first, decide after).

use std::fmt::{Display, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};

use toml::de::{DeTable, DeValue};
use toml::Spanned;

mod typed;

pub(super) use super::reference::quoted;
use super::reference::{KeyDefault, KeyDoc, Kind, SectionDoc};
use super::ConfigError;

/// A key as its section declares it: its name and meaning, and for a key without a default,
/// what leaving it out means and an example value.
#[derive(Clone, Copy)]
pub(super) struct Key {
    name: &'static str,
    meaning: &'static str,
    unset: Option<&'static str>,
    example: Option<&'static str>,
}

/// The key `name`, which means `meaning` (one line, for the reference and the example config).
pub(super) const fn key(name: &'static str, meaning: &'static str) -> Key {
    Key {
        name,
        meaning,
        unset: None,
        example: None,
    }
}

impl Key {
    /// The key's name.
    pub const fn name(self) -> &'static str {
        self.name
    }

    /// What leaving out this key (which has no default) means, e.g. "plain HTTP".
    pub const fn unset(self, means: &'static str) -> Key {
        Key {
            unset: Some(means),
            ..self
        }
    }

    /// A value for the example config, as the key's reader takes it (a string unquoted); a
    /// required key reads it in reference mode.
    pub const fn example(self, value: &'static str) -> Key {
        Key {
            example: Some(value),
            ..self
        }
    }
}

/// The document being read: where errors point, and the printout of every key read so far.
pub(super) struct Doc<'t> {
    file: &'t Path,
    text: &'t str,
    /// The effective configuration as TOML, section by section in reading order.
    printout: String,
    /// The sections read, for rejecting the others.
    sections: Vec<&'static str>,
    /// In reference mode, the sections and keys read.
    reference: Option<Vec<SectionDoc>>,
}

impl<'t> Doc<'t> {
    pub fn new(file: &'t Path, text: &'t str) -> Doc<'t> {
        Doc {
            file,
            text,
            printout: String::new(),
            sections: Vec::new(),
            reference: None,
        }
    }

    /// An empty document in reference mode (see the module's comment).
    pub fn reference() -> Doc<'static> {
        Doc {
            reference: Some(Vec::new()),
            ..Doc::new(Path::new("(reference)"), "")
        }
    }

    /// The document's tables, or the TOML syntax error.
    pub fn tables(&self) -> Result<Spanned<DeTable<'t>>, ConfigError> {
        DeTable::parse(self.text).or_else(|e| self.err(e.span(), e.message()))
    }

    pub fn take_printout(&mut self) -> String {
        std::mem::take(&mut self.printout)
    }

    /// The sections and keys read in reference mode.
    pub fn into_reference(self) -> Vec<SectionDoc> {
        self.reference.unwrap_or_default()
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

    /// The value of environment variable `name`; in reference mode, a placeholder.
    fn env(&self, name: &str) -> Option<String> {
        match self.reference {
            Some(_) => Some(format!("{{the value of {name}, read when the config is loaded}}")),
            None => std::env::var(name).ok(),
        }
    }

    /// `text` with every `${NAME}` replaced by the environment variable NAME (which must be set).
    fn expand_env(&self, text: &str) -> Result<String, String> {
        let mut out = String::with_capacity(text.len());
        let mut rest = text;
        while let Some(start) = rest.find("${") {
            out.push_str(&rest[..start]);
            let Some(len) = rest[start + 2..].find('}') else {
                return Err("unterminated ${".into());
            };
            let name = &rest[start + 2..start + 2 + len];
            out.push_str(
                &self
                    .env(name)
                    .ok_or_else(|| format!("environment variable {name} is not set"))?,
            );
            rest = &rest[start + 3 + len..];
        }
        out.push_str(rest);
        Ok(out)
    }

    /// Rejects top-level keys that are no section read.
    pub fn only_sections_read(&self, root: &DeTable<'t>) -> Result<(), ConfigError> {
        match root
            .iter()
            .find(|(k, _)| !self.sections.contains(&k.get_ref().as_ref()))
        {
            Some((k, _)) => self.err(
                Some(k.span()),
                format!(
                    "unknown section `{}` (expected one of: {})",
                    k.get_ref(),
                    self.sections.join(", ")
                ),
            ),
            None => Ok(()),
        }
    }

    fn declare_section(&mut self, name: &'static str, array: bool, about: &'static str) {
        self.sections.push(name);
        if let Some(sections) = &mut self.reference {
            sections.push(SectionDoc {
                name,
                array,
                about,
                optional: false,
                keys: Vec::new(),
            });
        }
    }

    /// The section `name` (`[name]`), which is `about` (one line, for the reference).
    pub fn section<'a>(
        &'a mut self,
        root: &'a DeTable<'t>,
        name: &'static str,
        about: &'static str,
    ) -> Result<Section<'a, 't>, ConfigError> {
        self.section_named(root, name, name, about)
    }

    /// The table `key` of `root`, named `name`.
    fn section_named<'a>(
        &'a mut self,
        root: &'a DeTable<'t>,
        key: &'static str,
        name: &'static str,
        about: &'static str,
    ) -> Result<Section<'a, 't>, ConfigError> {
        self.declare_section(name, false, about);
        let value = root.get(key);
        let table = match value.map(|v| (v.get_ref(), v.span())) {
            None if self.reference.is_some() => Some((root, 0..0)),
            None => None,
            Some((DeValue::Table(t), span)) => Some((t, span)),
            Some((_, span)) => return self.err(Some(span), format!("{name}: must be a table ([{name}])")),
        };
        Ok(Section::new(self, name, table, false))
    }

    /// The table `key` of section `parent` (`[parent.key]`, named `name` in errors and the
    /// reference), which is `about`. The parent's reader marks `key` read ([`Section::nested`]).
    pub fn section_in<'a>(
        &'a mut self,
        root: &'a DeTable<'t>,
        parent: &'static str,
        key: &'static str,
        name: &'static str,
        about: &'static str,
    ) -> Result<Section<'a, 't>, ConfigError> {
        match parent_table(root, parent) {
            Some(table) => self.section_named(table, key, name, about),
            // No parent: nothing to read, but in reference mode, where `root` is empty.
            None if self.reference.is_some() => self.section_named(root, key, name, about),
            None => {
                self.declare_section(name, false, about);
                Ok(Section::new(self, name, None, false))
            }
        }
    }

    /// The elements of the array of tables `key` of section `parent` (`[[parent.key]]`, named
    /// `name`), as [`Doc::elements`] gives those of a top-level one.
    pub fn elements_in<'a>(
        &mut self,
        root: &'a DeTable<'t>,
        parent: &'static str,
        key: &'static str,
        name: &'static str,
        about: &'static str,
    ) -> Result<Vec<(&'a DeTable<'t>, Range<usize>)>, ConfigError> {
        match parent_table(root, parent) {
            Some(table) => self.elements_named(table, key, name, about),
            None if self.reference.is_some() => self.elements_named(root, key, name, about),
            None => {
                self.declare_section(name, true, about);
                Ok(Vec::new())
            }
        }
    }

    /// The elements of the array of tables `name` (`[[name]]`), each `about`, to be read with
    /// [`Section::element`]. In reference mode, one empty element.
    pub fn elements<'a>(
        &mut self,
        root: &'a DeTable<'t>,
        name: &'static str,
        about: &'static str,
    ) -> Result<Vec<(&'a DeTable<'t>, Range<usize>)>, ConfigError> {
        self.elements_named(root, name, name, about)
    }

    fn elements_named<'a>(
        &mut self,
        root: &'a DeTable<'t>,
        key: &'static str,
        name: &'static str,
        about: &'static str,
    ) -> Result<Vec<(&'a DeTable<'t>, Range<usize>)>, ConfigError> {
        self.declare_section(name, true, about);
        let Some(value) = root.get(key) else {
            return Ok(match self.reference {
                Some(_) => vec![(root, 0..0)],
                None => Vec::new(),
            });
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

/// A string value as written, with where it stands (for checks made after reading).
pub(super) struct Text<'a> {
    pub value: &'a str,
    pub span: Option<Range<usize>>,
}

/// A string value with every `${VAR}` read from the environment, with where it stands.
pub(super) struct Secret {
    pub value: String,
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

    /// An element of an array of tables (from [`Doc::elements`]).
    pub fn element(doc: &'a mut Doc<'t>, name: &'static str, table: &'a DeTable<'t>, span: Range<usize>) -> Self {
        Section::new(doc, name, Some((table, span)), true)
    }

    /// Whether the document has this section (always, in reference mode).
    pub fn present(&self) -> bool {
        self.table.is_some()
    }

    /// Whether the document is read for the reference (every section present and empty): for
    /// checks across keys that an empty section would fail but a real one may not.
    pub fn reference_mode(&self) -> bool {
        self.doc.reference.is_some()
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

    /// Marks `key` read, records its entry in reference mode (`doc` makes it: the default, as
    /// TOML, and what values are allowed), and returns its value in the document.
    fn value(
        &mut self,
        key: Key,
        kind: Kind,
        doc: impl FnOnce() -> (KeyDefault, Option<String>),
    ) -> Result<Option<&'a Spanned<DeValue<'t>>>, ConfigError> {
        if !self.read.contains(&key.name) {
            self.read.push(key.name);
            if self.doc.reference.is_some() {
                self.document(key, kind, doc())?;
            }
        }
        Ok(self.table.and_then(|t| t.get(key.name)))
    }

    fn document(
        &mut self,
        key: Key,
        kind: Kind,
        (default, allowed): (KeyDefault, Option<String>),
    ) -> Result<(), ConfigError> {
        let name = self.key_name(key.name);
        let example = match (&default, key.example) {
            (KeyDefault::Value(v), _) => v.clone(),
            (_, Some(e)) => kind.example(e),
            (_, None) => return self.err(None, format!("{name}: declared without a default or an example")),
        };
        if matches!(default, KeyDefault::Unset(_)) && key.unset.is_none() {
            return self.err(
                None,
                format!("{name}: declared without saying what leaving it out means"),
            );
        }
        let sections = self.doc.reference.as_mut().expect("reference mode");
        let section = sections.last_mut().expect("a section is declared before its keys");
        section.keys.push(KeyDoc {
            key: key.name,
            kind,
            default,
            allowed,
            meaning: key.meaning,
            example,
        });
        Ok(())
    }

    fn wrong_type<T>(&self, key: &str, v: &Spanned<DeValue<'t>>, expected: &str) -> Result<T, ConfigError> {
        self.err(Some(v.span()), format!("{}: expected {expected}", self.key_name(key)))
    }

    /// Marks `keys` read: tables of this section read as sections of their own
    /// ([`Doc::section_in`], [`Doc::elements_in`]).
    pub fn nested(&mut self, keys: &[&'static str]) {
        for key in keys {
            if !self.read.contains(key) {
                self.read.push(key);
            }
        }
    }

    /// Records `key = value` (a TOML value, already written as TOML) in the printout.
    pub fn print(&mut self, key: &str, toml_value: impl Display) {
        let _ = writeln!(self.printout, "{key} = {toml_value}");
    }

    /// Adds a `# comment` line to the printout (what an unset optional key means).
    pub fn print_comment(&mut self, comment: &str) {
        let _ = writeln!(self.printout, "# {comment}");
    }

    /// Rejects keys no reader asked for, and adds the section to the printout. A section absent
    /// from the file is printed with its defaults when `print_absent`; one that is not is
    /// optional, and commented out in the example config.
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
        if let Some(section) = self.doc.reference.as_mut().and_then(|s| s.last_mut()) {
            section.optional = !print_absent;
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

/// The section `parent` of `root`, when it is a table (its own reader refuses anything else).
fn parent_table<'a, 't>(root: &'a DeTable<'t>, parent: &str) -> Option<&'a DeTable<'t>> {
    match root.get(parent).map(|v| v.get_ref()) {
        Some(DeValue::Table(t)) => Some(t),
        _ => None,
    }
}
