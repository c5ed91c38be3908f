//! Tells the binary which commit it is built from (`mrtr-router --version`): `MRTR_COMMIT` is
//! the first 12 hex digits of `HEAD`, or `unknown` outside a git checkout (a source tarball).

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let manifest_dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let commit = match git_dirs(&manifest_dir) {
        Some((git_dir, common_dir)) => {
            // A new commit moves HEAD or the branch it points to, which may live in packed-refs.
            // In a worktree, HEAD is in its own git dir and the refs are in the common one.
            println!("cargo:rerun-if-changed={}", git_dir.join("HEAD").display());
            if let Some(branch) = git(&manifest_dir, &["symbolic-ref", "-q", "HEAD"]) {
                for file in [common_dir.join(&branch), common_dir.join("packed-refs")] {
                    if file.exists() {
                        println!("cargo:rerun-if-changed={}", file.display());
                    }
                }
            }
            git(&manifest_dir, &["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into())
        }
        None => "unknown".into(),
    };
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rustc-env=MRTR_COMMIT={commit}");
}

/// The git dir and the common git dir of the checkout whose top is `dir` (not of a repository
/// `dir` merely sits inside, such as a tarball unpacked in someone's home repository).
fn git_dirs(dir: &Path) -> Option<(PathBuf, PathBuf)> {
    let top = PathBuf::from(git(dir, &["rev-parse", "--show-toplevel"])?);
    if top.canonicalize().ok()? != dir.canonicalize().ok()? {
        return None;
    }
    let absolute = |p: String| match Path::new(&p).is_absolute() {
        true => PathBuf::from(p),
        false => dir.join(p),
    };
    let git_dir = absolute(git(dir, &["rev-parse", "--git-dir"])?);
    let common_dir = absolute(git(dir, &["rev-parse", "--git-common-dir"])?);
    Some((git_dir, common_dir))
}

/// `git args` run in `dir`: its output's first line, when it succeeds.
fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).current_dir(dir).output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    let line = text.lines().next()?.trim();
    (out.status.success() && !line.is_empty()).then(|| line.to_string())
}
