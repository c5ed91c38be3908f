//! The configuration reference comes from the code that reads the config: the checked-in
//! chapter is what `config reference` prints, every key says what it means, the reference lists
//! exactly the keys each section accepts, and `config example` is a config `check` accepts as
//! the defaults.

use std::path::Path;
use std::process::{Command, Output};

use mrtr_router::config::{KeyDefault, Kind, Reference, SectionDoc, REGENERATE};
use mrtr_router::Config;

/// The router cargo built, or the one `MRTR_TEST_ROUTER_BIN` names (as tests/it/support's `bin()`).
fn bin() -> String {
    std::env::var("MRTR_TEST_ROUTER_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_mrtr-router").into())
}

fn run(args: &[&str]) -> Output {
    let out = Command::new(bin()).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "mrtr-router {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn reference() -> Reference {
    Config::reference().unwrap_or_else(|e| panic!("the reference cannot be read: {e}"))
}

#[test]
fn the_checked_in_chapter_is_the_generated_one() {
    let generated = String::from_utf8(run(&["config", "reference"]).stdout).unwrap();
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/src/configuration.md");
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    if generated != checked_in {
        let first = generated
            .lines()
            .zip(checked_in.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(generated.lines().count().min(checked_in.lines().count()));
        panic!(
            "{} is not what `mrtr-router config reference` prints (first difference at line {}); \
             regenerate it with:\n    {REGENERATE}",
            path.display(),
            first + 1
        );
    }
}

#[test]
fn every_section_and_key_says_what_it_means_in_one_line() {
    let reference = reference();
    let names: Vec<&str> = reference.sections.iter().map(|s| s.name).collect();
    assert_eq!(
        names,
        [
            "server",
            "admin",
            "routing",
            "health",
            "tokens",
            "auth",
            "auth.resource_metadata",
            "auth.tool",
            "auth.method",
            "quotas",
            "quotas.tool",
            "discovery",
            "upstream",
            "backend",
            "log",
            "tracing",
            "catalog"
        ]
    );
    let one_line = |text: &str| !text.trim().is_empty() && !text.contains('\n') && text.ends_with('.');
    for section in &reference.sections {
        assert!(one_line(section.about), "[{}]: {:?}", section.name, section.about);
        assert!(!section.keys.is_empty(), "[{}] has no keys", section.name);
        for k in &section.keys {
            let name = format!("{}.{}", section.name, k.key);
            assert!(one_line(k.meaning), "{name} has no one-line meaning: {:?}", k.meaning);
            if let KeyDefault::Unset(means) = k.default {
                assert!(!means.trim().is_empty(), "{name}: what leaving it out means");
            }
        }
    }
}

/// A section's unknown key is refused with the list of the keys it reads: that list is the
/// reference's, for every section (keys read only in some cases would be missing otherwise).
#[test]
fn the_reference_lists_exactly_the_keys_each_section_reads() {
    let backend = "[[backend]]\nname = \"a\"\nurl = \"http://127.0.0.1:9001\"\n";
    let reference = reference();
    let required = |section: &SectionDoc| {
        let mut text = String::new();
        for k in section.keys.iter().filter(|k| k.default == KeyDefault::Required) {
            let value = match k.kind {
                Kind::Secrets => "[\"0123456789abcdef0123456789abcdef\"]",
                _ => &k.example,
            };
            text.push_str(&format!("{} = {value}\n", k.key));
        }
        text
    };
    for section in &reference.sections {
        // The section with what it (and the section it is in) requires, and one key too many.
        let parent = section
            .name
            .split_once('.')
            .and_then(|(p, _)| reference.sections.iter().find(|s| s.name == p));
        let mut text = match parent {
            Some(p) => format!("{backend}[{}]\n{}", p.name, required(p)),
            None if section.array => String::new(),
            None => backend.to_string(),
        };
        text.push_str(&match section.array {
            true => format!("[[{}]]\n", section.name),
            false => format!("[{}]\n", section.name),
        });
        text.push_str(&required(section));
        text.push_str("surely_no_key = 1\n");
        // The other sections within the same section, with their required keys.
        let top = section.name.split('.').next().unwrap();
        let within = |s: &&SectionDoc| s.name.strip_prefix(top).is_some_and(|r| r.starts_with('.'));
        for other in reference
            .sections
            .iter()
            .filter(within)
            .filter(|s| s.name != section.name && !s.array)
        {
            text.push_str(&format!("[{}]\n{}", other.name, required(other)));
        }
        let e = Config::parse(Path::new("c.toml"), &text).unwrap_err().to_string();
        let listed = e
            .split_once("(expected one of: ")
            .and_then(|(_, rest)| rest.strip_suffix(')'))
            .unwrap_or_else(|| panic!("{text}: {e}"));
        // The keys, then the tables read as sections of their own (`[auth.resource_metadata]`).
        let nested = reference
            .sections
            .iter()
            .filter_map(|s| s.name.strip_prefix(section.name)?.strip_prefix('.'))
            .collect::<Vec<_>>();
        let documented: Vec<&str> = section.keys.iter().map(|k| k.key).chain(nested).collect();
        assert_eq!(listed.split(", ").collect::<Vec<_>>(), documented, "{text}");
    }
}

/// `config example` is a whole config file: `check` accepts it as it is, and it makes the
/// defaults (the configuration of its one backend alone).
#[test]
fn the_example_config_passes_check_and_is_the_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let example = dir.path().join("example.toml");
    std::fs::write(&example, run(&["config", "example"]).stdout).unwrap();
    let effective = run(&["check", "--config", example.to_str().unwrap()]).stdout;

    let reference = reference();
    let backend = reference.sections.iter().find(|s| s.name == "backend").unwrap();
    let mut minimal = String::from("[[backend]]\n");
    for k in backend.keys.iter().filter(|k| k.default == KeyDefault::Required) {
        minimal.push_str(&format!("{} = {}\n", k.key, k.example));
    }
    let defaults = dir.path().join("defaults.toml");
    std::fs::write(&defaults, &minimal).unwrap();
    let expected = run(&["check", "--config", defaults.to_str().unwrap()]).stdout;
    assert_eq!(
        String::from_utf8(effective).unwrap(),
        String::from_utf8(expected).unwrap(),
        "the example config is not the defaults of {minimal:?}"
    );
}
