//! The config file a running router reloads: its path, and the content it last applied and
//! last rejected, so that an unchanged file is not applied again and a broken one is reported
//! once.

use std::path::{Path, PathBuf};

use parking_lot::Mutex;

use super::{Config, ConfigError};

pub struct ConfigFile {
    path: PathBuf,
    /// Digests of the text last applied and last rejected.
    digests: Mutex<(Option<u64>, Option<u64>)>,
}

/// What reading the file again found.
pub enum Reread {
    /// The same text and the same files it names: nothing to do.
    Unchanged,
    /// A new config to apply, with the digest of its text (see [`ConfigFile::applied`]).
    Changed(Box<Config>, u64),
}

impl ConfigFile {
    /// The file `config` was read from, as `text`.
    pub fn new(path: &Path, text: &str) -> ConfigFile {
        ConfigFile {
            path: path.to_path_buf(),
            digests: Mutex::new((Some(digest(text.as_bytes())), None)),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads the file again and compares it with `running`. Unchanged text may still name TLS
    /// files, an `auth.jwks_file` or a `catalog.lock` whose content changed (a renewed
    /// certificate, CA bundle or system trust store, rotated keys, definitions approved anew):
    /// then the config is read again and compared whole. A config that fails to load counts as
    /// rejected.
    pub fn reread(&self, running: &Config) -> Result<Reread, ConfigError> {
        let text = Config::read_text(&self.path)?;
        let digest = digest(text.as_bytes());
        let unchanged = self.digests.lock().0 == Some(digest);
        let reads_keys = running
            .auth
            .as_ref()
            .is_some_and(|a| matches!(a.jwks, super::JwksSource::File { .. }));
        let reads_lock = running.catalog.as_ref().is_some_and(|c| c.lock.is_some());
        let reads_files =
            running.server.tls.is_some() || running.upstream.tls.reads_files() || reads_keys || reads_lock;
        if unchanged && !reads_files {
            return Ok(Reread::Unchanged);
        }
        match Config::parse(&self.path, &text) {
            Ok(config) if unchanged && config == *running => Ok(Reread::Unchanged),
            Ok(config) => Ok(Reread::Changed(Box::new(config), digest)),
            Err(e) => {
                self.rejected(digest);
                Err(e)
            }
        }
    }

    /// Notes that the text with `digest` now runs.
    pub fn applied(&self, digest: u64) {
        *self.digests.lock() = (Some(digest), None);
    }

    /// Notes that the text with `digest` was refused.
    pub fn rejected(&self, digest: u64) {
        self.digests.lock().1 = Some(digest);
    }

    /// Whether `content` is neither what runs nor what was already refused (the file watcher
    /// reloads only then).
    pub fn is_new(&self, content: &[u8]) -> bool {
        let d = digest(content);
        let known = self.digests.lock();
        known.0 != Some(d) && known.1 != Some(d)
    }
}

fn digest(bytes: &[u8]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    bytes.hash(&mut h);
    h.finish()
}
