//! The typed readers of a section's keys: each checks a value of its type, prints it, and in
//! reference mode documents the key (its type, default and the values it allows).

use std::net::SocketAddr;
use std::ops::{Range, RangeInclusive};
use std::time::Duration;

use toml::de::DeValue;

use super::super::reference::{KeyDefault, Kind};
use super::super::{defaults, ConfigError};
use super::{quoted, Key, Secret, Section, Text};

/// What a string in which `${VAR}` reads the environment allows.
const ENV_ALLOWED: &str = "`${VAR}` reads the environment variable VAR";

impl<'a, 't> Section<'a, 't> {
    /// A string's value as written, documented by `doc` in reference mode.
    fn string_value(
        &mut self,
        key: Key,
        kind: Kind,
        doc: impl FnOnce() -> (KeyDefault, Option<String>),
    ) -> Result<Option<Text<'a>>, ConfigError> {
        match self.value(key, kind, doc)? {
            None => Ok(None),
            Some(v) => match v.get_ref() {
                DeValue::String(s) => Ok(Some(Text {
                    value: s.as_ref(),
                    span: Some(v.span()),
                })),
                _ => self.wrong_type(key.name, v, "a string"),
            },
        }
    }

    /// An optional string of `kind` without a default; `None` when absent. Not printed: the
    /// caller prints what it made of it.
    pub fn text(&mut self, key: Key, kind: Kind) -> Result<Option<Text<'a>>, ConfigError> {
        let allowed = (kind == Kind::Secret).then(|| ENV_ALLOWED.to_string());
        self.string_value(key, kind, || {
            (KeyDefault::Unset(key.unset.unwrap_or_default()), allowed)
        })
    }

    /// A string of `kind` with a default; not printed.
    pub fn text_or(&mut self, key: Key, kind: Kind, default: &'static str) -> Result<Text<'a>, ConfigError> {
        let text = self.string_value(key, kind, || (KeyDefault::Value(quoted(default)), None))?;
        Ok(text.unwrap_or(Text {
            value: default,
            span: None,
        }))
    }

    /// A string with a default in which `${VAR}` reads the environment (a URL with a password);
    /// not printed.
    pub fn secret_or(&mut self, key: Key, default: &'static str) -> Result<Secret, ConfigError> {
        let doc = || (KeyDefault::Value(quoted(default)), Some(ENV_ALLOWED.to_string()));
        let text = self.string_value(key, Kind::Secret, doc)?.unwrap_or(Text {
            value: default,
            span: None,
        });
        self.expand(&self.key_name(key.name), text)
    }

    /// A string of `kind` the section needs; in reference mode, the key's example. Not printed.
    pub fn required(&mut self, key: Key, kind: Kind) -> Result<Text<'a>, ConfigError> {
        match self.string_value(key, kind, || (KeyDefault::Required, None))? {
            Some(text) => Ok(text),
            None => Ok(Text {
                value: self.missing(key, kind)?,
                span: None,
            }),
        }
    }

    /// What a required key that is absent reads: an error, or in reference mode its example.
    fn missing(&self, key: Key, kind: Kind) -> Result<&'static str, ConfigError> {
        let example = key.example.unwrap_or_default();
        match self.doc.reference {
            Some(_) => Ok(example),
            None => self.err(
                self.span(),
                format!("{}: required, e.g. {}", self.key_name(key.name), kind.example(example)),
            ),
        }
    }

    /// `text` with every `${VAR}` read from the environment; errors name `name`.
    fn expand(&self, name: &str, text: Text) -> Result<Secret, ConfigError> {
        match self.doc.expand_env(text.value) {
            Ok(value) => Ok(Secret { value, span: text.span }),
            Err(e) => self.err(text.span, format!("{name}: {e}")),
        }
    }

    /// A string with a default, printed.
    pub fn string(&mut self, key: Key, default: &'static str) -> Result<(String, Option<Range<usize>>), ConfigError> {
        let text = self.text_or(key, Kind::String, default)?;
        self.print(key.name, quoted(text.value));
        Ok((text.value.to_string(), text.span))
    }

    /// An optional secret string (`${VAR}` read from the environment); not printed.
    pub fn secret(&mut self, key: Key) -> Result<Option<Secret>, ConfigError> {
        let Some(text) = self.text(key, Kind::Secret)? else {
            return Ok(None);
        };
        self.expand(&self.key_name(key.name), text).map(Some)
    }

    /// A required array of secret strings, with where the array stands; in reference mode, the
    /// key's example alone. Not printed.
    pub fn required_secrets(&mut self, key: Key) -> Result<(Vec<Secret>, Option<Range<usize>>), ConfigError> {
        let doc = || (KeyDefault::Required, Some(ENV_ALLOWED.to_string()));
        let (texts, span) = match self.value(key, Kind::Secrets, doc)? {
            None => (
                vec![Text {
                    value: self.missing(key, Kind::Secrets)?,
                    span: None,
                }],
                None,
            ),
            Some(v) => (self.texts_of(key.name, v)?, Some(v.span())),
        };
        let secrets = texts.into_iter().enumerate();
        let secrets = secrets.map(|(i, text)| self.expand(&format!("{}[{i}]", self.key_name(key.name)), text));
        Ok((secrets.collect::<Result<_, _>>()?, span))
    }

    /// An array of strings, each a `kind`; `None` when absent (the key declares what that means,
    /// [`Key::unset`]). Not printed: the caller prints what it made of it ([`Section::print_strings`]).
    pub fn strings(&mut self, key: Key, kind: Kind) -> Result<Option<TextList<'a>>, ConfigError> {
        let doc = || (KeyDefault::Unset(key.unset.unwrap_or_default()), list_of(kind));
        self.string_list(key, doc)
    }

    /// An array of strings with a default (written as TOML, e.g. `["RS256"]`); not printed.
    pub fn strings_or(
        &mut self,
        key: Key,
        kind: Kind,
        default: &'static [&'static str],
    ) -> Result<TextList<'a>, ConfigError> {
        let doc = || (KeyDefault::Value(toml_strings(default.iter().copied())), list_of(kind));
        let list = self.string_list(key, doc)?;
        Ok(list.unwrap_or_else(|| (default.iter().map(|v| Text { value: v, span: None }).collect(), None)))
    }

    fn string_list(
        &mut self,
        key: Key,
        doc: impl FnOnce() -> (KeyDefault, Option<String>),
    ) -> Result<Option<TextList<'a>>, ConfigError> {
        let Some(v) = self.value(key, Kind::Strings, doc)? else {
            return Ok(None);
        };
        Ok(Some((self.texts_of(key.name, v)?, Some(v.span()))))
    }

    /// The strings of the array `v`, each with where it stands.
    fn texts_of(&self, name: &str, v: &'a toml::Spanned<DeValue<'t>>) -> Result<Vec<Text<'a>>, ConfigError> {
        let DeValue::Array(items) = v.get_ref() else {
            return self.wrong_type(name, v, "an array of strings");
        };
        let mut texts = Vec::with_capacity(items.len());
        for item in items.iter() {
            match item.get_ref() {
                DeValue::String(s) => texts.push(Text {
                    value: s.as_ref(),
                    span: Some(item.span()),
                }),
                _ => return self.wrong_type(name, item, "an array of strings"),
            }
        }
        Ok(texts)
    }

    /// Records `key = [..]` in the printout.
    pub fn print_strings<'s>(&mut self, key: &str, values: impl IntoIterator<Item = &'s str>) {
        self.print(key, toml_strings(values));
    }

    /// An integer within `range`, printed.
    pub fn int(&mut self, key: Key, default: i64, range: RangeInclusive<i64>) -> Result<i64, ConfigError> {
        let n = self.int_value(key, KeyDefault::Value(default.to_string()), range)?;
        let n = n.unwrap_or(default);
        self.print(key.name, n);
        Ok(n)
    }

    /// An integer within `range` without a default: `None` when absent (the key declares what
    /// that means, [`Key::unset`]). Printed when set.
    pub fn maybe_int(&mut self, key: Key, range: RangeInclusive<i64>) -> Result<Option<i64>, ConfigError> {
        let n = self.int_value(key, KeyDefault::Unset(key.unset.unwrap_or_default()), range)?;
        if let Some(n) = n {
            self.print(key.name, n);
        }
        Ok(n)
    }

    fn int_value(
        &mut self,
        key: Key,
        default: KeyDefault,
        range: RangeInclusive<i64>,
    ) -> Result<Option<i64>, ConfigError> {
        let (min, max) = (*range.start(), *range.end());
        let doc = || (default, Some(format!("{} to {}", grouped(min), grouped(max))));
        let n = match self.value(key, Kind::Integer, doc)? {
            None => None,
            Some(v) => {
                let n = match v.get_ref() {
                    DeValue::Integer(i) => i64::from_str_radix(i.as_str(), i.radix()).ok(),
                    _ => None,
                };
                let Some(n) = n else {
                    return self.wrong_type(key.name, v, "an integer");
                };
                if !range.contains(&n) {
                    return self.err(
                        Some(v.span()),
                        format!("{}: {n} is out of range {min}..={max}", self.key_name(key.name)),
                    );
                }
                Some(n)
            }
        };
        Ok(n)
    }

    /// `true` or `false` without a default: `None` when absent. Not printed.
    pub fn maybe_bool(&mut self, key: Key) -> Result<Option<bool>, ConfigError> {
        let doc = || (KeyDefault::Unset(key.unset.unwrap_or_default()), None);
        match self.value(key, Kind::Boolean, doc)? {
            None => Ok(None),
            Some(v) => match v.get_ref() {
                DeValue::Boolean(b) => Ok(Some(*b)),
                _ => self.wrong_type(key.name, v, "true or false"),
            },
        }
    }

    /// `true` or `false` with a default, printed.
    pub fn bool(&mut self, key: Key, default: bool) -> Result<bool, ConfigError> {
        let doc = || (KeyDefault::Value(default.to_string()), None);
        let b = match self.value(key, Kind::Boolean, doc)? {
            None => default,
            Some(v) => match v.get_ref() {
                DeValue::Boolean(b) => *b,
                _ => return self.wrong_type(key.name, v, "true or false"),
            },
        };
        self.print(key.name, b);
        Ok(b)
    }

    /// A number (integer or float) that passes `valid`, which `allowed` says in words (errors
    /// read "`section.key`: must be {allowed}"); printed.
    pub fn float(
        &mut self,
        key: Key,
        default: f64,
        valid: impl Fn(f64) -> bool,
        allowed: &str,
    ) -> Result<f64, ConfigError> {
        let doc = || {
            (
                KeyDefault::Value(toml::Value::Float(default).to_string()),
                Some(allowed.to_string()),
            )
        };
        let x = match self.value(key, Kind::Number, doc)? {
            None => default,
            Some(v) => {
                let x = match v.get_ref() {
                    DeValue::Float(f) => f.as_str().parse::<f64>().ok(),
                    DeValue::Integer(i) => i64::from_str_radix(i.as_str(), i.radix()).ok().map(|n| n as f64),
                    _ => None,
                };
                let Some(x) = x else {
                    return self.wrong_type(key.name, v, "a number");
                };
                if !valid(x) {
                    return self.err(
                        Some(v.span()),
                        format!("{}: must be {allowed}", self.key_name(key.name)),
                    );
                }
                x
            }
        };
        self.print(key.name, toml::Value::Float(x));
        Ok(x)
    }

    /// A duration like `"10s"`, `"5m"`: greater than zero, at most [`defaults::MAX_DURATION`];
    /// printed.
    pub fn duration(&mut self, key: Key, default: Duration) -> Result<Duration, ConfigError> {
        self.duration_at_least(key, default, Duration::ZERO)
    }

    /// A duration of at least `min` (and greater than zero), at most [`defaults::MAX_DURATION`];
    /// printed.
    pub fn duration_at_least(&mut self, key: Key, default: Duration, min: Duration) -> Result<Duration, ConfigError> {
        // The bounds every duration has are said once, in the reference's introduction.
        let doc = || {
            let allowed = (!min.is_zero()).then(|| format!("at least \"{}s\"", min.as_secs()));
            (KeyDefault::Value(duration_toml(default)), allowed)
        };
        let d = match self.string_value(key, Kind::Duration, doc)? {
            None => default,
            Some(t) => {
                let name = self.key_name(key.name);
                match humantime::parse_duration(t.value.trim()) {
                    Ok(d) if d.is_zero() => return self.err(t.span, format!("{name}: must be greater than zero")),
                    Ok(d) if d < min => {
                        return self.err(
                            t.span,
                            format!("{name}: must be at least {}", humantime::format_duration(min)),
                        )
                    }
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
        self.print(key.name, duration_toml(d));
        Ok(d)
    }

    /// An `IP:port` socket address; printed.
    pub fn addr(&mut self, key: Key, default: &'static str) -> Result<(SocketAddr, Option<Range<usize>>), ConfigError> {
        let text = self.text_or(key, Kind::Address, default)?;
        let Ok(addr) = text.value.parse::<SocketAddr>() else {
            return self.err(
                text.span,
                format!(
                    "{}: {:?} is not an IP:port address",
                    self.key_name(key.name),
                    text.value
                ),
            );
        };
        self.print(key.name, quoted(&addr.to_string()));
        Ok((addr, text.span))
    }

    /// One of `choices` by name; printed.
    pub fn choice<T: Copy>(
        &mut self,
        key: Key,
        default: &'static str,
        choices: &[(&str, T)],
    ) -> Result<T, ConfigError> {
        let names: Vec<&str> = choices.iter().map(|(n, _)| *n).collect();
        let allowed = || {
            names
                .iter()
                .map(|n| format!("`{}`", quoted(n)))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let doc = || (KeyDefault::Value(quoted(default)), Some(allowed()));
        let text = self.string_value(key, Kind::String, doc)?.unwrap_or(Text {
            value: default,
            span: None,
        });
        let Some((name, value)) = choices.iter().find(|(n, _)| *n == text.value) else {
            return self.err(
                text.span,
                format!(
                    "{}: {:?} is not one of {}",
                    self.key_name(key.name),
                    text.value,
                    names.join(", ")
                ),
            );
        };
        self.print(key.name, quoted(name));
        Ok(*value)
    }
}

/// An array of strings as written, with where the array stands (none: the default).
pub(in crate::config) type TextList<'a> = (Vec<Text<'a>>, Option<Range<usize>>);

/// What an array of `kind`s allows, beyond being an array of strings.
fn list_of(kind: Kind) -> Option<String> {
    (kind != Kind::String).then(|| format!("each a {kind}"))
}

/// Strings as a TOML array.
pub(in crate::config) fn toml_strings<'s>(values: impl IntoIterator<Item = &'s str>) -> String {
    let quoted: Vec<String> = values.into_iter().map(quoted).collect();
    format!("[{}]", quoted.join(", "))
}

/// A duration as TOML: a string humantime reads back.
fn duration_toml(d: Duration) -> String {
    quoted(&humantime::format_duration(d).to_string())
}

/// `n` with its digits in groups of three, for reading: 1,000,000.
fn grouped(n: i64) -> String {
    let digits = n.unsigned_abs().to_string();
    let mut out = String::new();
    for (i, ch) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    match n < 0 {
        true => format!("-{out}"),
        false => out,
    }
}
