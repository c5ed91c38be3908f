//! The shape of `src/`, as ARCHITECTURE.md states it.
//!
//! Arrows go one way: no two modules of `src/` import each other, directly or through a circle.
//! Reads every path in `src/` (unit tests excluded), resolves each to the module (file) it
//! names, and fails naming the circle. Two graphs are checked: the top-level modules (`proxy`
//! stands for all of `src/proxy/`), and the files, where a folder's `mod.rs` and its own files
//! may name each other (it declares them and re-exports what they define, they use what it
//! defines) but sibling files may not form a circle.
//!
//! The code map is whole: ARCHITECTURE.md's "Code map" names every top-level module of `src/`
//! (each file as `name.rs`, each folder as `name/`) in its headings, and nothing that is not
//! there. What is inside a folder is its own `//!` lines' to say.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A module's path below the crate root: `[]` is `lib.rs`, `["upstream", "pool"]` is
/// `src/upstream/pool.rs`.
type Module = Vec<String>;

/// Every `.rs` file below `src`, with the module it is: `lib.rs` is `[]`, `upstream/pool.rs`
/// is `["upstream", "pool"]`, `upstream/mod.rs` is `["upstream"]`, `main.rs` (the binary's
/// root) is `["main"]`.
fn source_files(src: &Path) -> Vec<(Module, PathBuf)> {
    let mut out = Vec::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let rel = path.strip_prefix(src).unwrap().with_extension("");
            let mut module: Module = rel.iter().map(|s| s.to_string_lossy().into_owned()).collect();
            if module.last().is_some_and(|l| l == "mod") || module == ["lib"] {
                module.pop();
            }
            out.push((module, path));
        }
    }
    out
}

/// The module each source file of the library is.
fn modules(src: &Path) -> BTreeMap<Module, PathBuf> {
    source_files(src)
        .into_iter()
        .filter(|(module, _)| module.as_slice() != ["main"])
        .collect()
}

#[derive(Debug, PartialEq)]
enum Token {
    Ident(String),
    PathSep,
    Open,
    Close,
    Comma,
    Other,
}

/// The code of a file as tokens, without comments, string literals and its unit tests.
fn tokens(text: &str) -> Vec<Token> {
    let code = match text.find("#[cfg(test)]\nmod tests") {
        Some(at) => &text[..at],
        None => text,
    };
    let chars: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '/' && chars.get(i + 1) == Some(&'/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '"' {
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            out.push(Token::Other);
        } else if c.is_alphanumeric() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            out.push(Token::Ident(chars[start..i].iter().collect()));
        } else if c == ':' && chars.get(i + 1) == Some(&':') {
            out.push(Token::PathSep);
            i += 2;
        } else {
            out.push(match c {
                '{' => Token::Open,
                '}' => Token::Close,
                ',' => Token::Comma,
                _ => Token::Other,
            });
            i += 1;
        }
    }
    out
}

/// Every path of two or more segments (a `use` tree expanded: `a::{b, c::d}` gives `a::b` and
/// `a::c::d`); [`resolve`] tells which name a module of the crate.
fn paths(tokens: &[Token]) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for (i, t) in tokens.iter().enumerate() {
        let Token::Ident(first) = t else { continue };
        let mid_path = i > 0 && tokens[i - 1] == Token::PathSep;
        if !mid_path && tokens.get(i + 1) == Some(&Token::PathSep) {
            tree(tokens, i + 1, vec![first.clone()], &mut out);
        }
    }
    out
}

/// Reads `::seg::seg…` or `::{…}` at `at` after `prefix`; returns where it stopped.
fn tree(tokens: &[Token], mut at: usize, mut prefix: Vec<String>, out: &mut Vec<Vec<String>>) -> usize {
    loop {
        if tokens.get(at) != Some(&Token::PathSep) {
            out.push(prefix);
            return at;
        }
        match tokens.get(at + 1) {
            Some(Token::Ident(seg)) => {
                prefix.push(seg.clone());
                at += 2;
            }
            Some(Token::Open) => {
                at += 2;
                loop {
                    match tokens.get(at) {
                        Some(Token::Ident(seg)) => {
                            let mut item = prefix.clone();
                            if seg != "self" {
                                item.push(seg.clone());
                            }
                            at = tree(tokens, at + 1, item, out);
                        }
                        Some(Token::Close) | None => return at + 1,
                        Some(_) => at += 1,
                    }
                }
            }
            _ => {
                out.push(prefix);
                return at;
            }
        }
    }
}

/// The module a path names: its longest prefix that is a module (`crate::upstream::Backend` is
/// `upstream`; `pool::Pool` in `upstream` is `upstream::pool`), or `None` for a path into
/// another crate, the module itself or its inline submodules.
fn resolve(from: &Module, path: &[String], known: &BTreeSet<Module>) -> Option<Module> {
    let mut base: Module = from.clone();
    let mut rest = path;
    match rest.first().map(String::as_str) {
        Some("crate") => {
            base.clear();
            rest = &rest[1..];
        }
        Some("self") => rest = &rest[1..],
        Some("super") => {
            while rest.first().is_some_and(|s| s == "super") {
                base.pop()?;
                rest = &rest[1..];
            }
        }
        // A child module, named without `self::`.
        Some(child) if known.contains(&[from.clone(), vec![child.to_string()]].concat()) => {}
        _ => return None,
    }
    let mut target = base.clone();
    let mut found = base;
    for seg in rest {
        target.push(seg.clone());
        if known.contains(&target) {
            found = target.clone();
        } else {
            break;
        }
    }
    (found != *from).then_some(found)
}

type Graph = BTreeMap<Module, BTreeSet<Module>>;

fn graph(src: &Path) -> Graph {
    let files = modules(src);
    let known: BTreeSet<Module> = files.keys().cloned().collect();
    files
        .iter()
        .map(|(module, path)| {
            let text = std::fs::read_to_string(path).unwrap();
            let edges = paths(&tokens(&text))
                .iter()
                .filter_map(|p| resolve(module, p, &known))
                .collect();
            (module.clone(), edges)
        })
        .collect()
}

fn name(m: &Module) -> String {
    match m.is_empty() {
        true => "crate".to_string(),
        false => m.join("::"),
    }
}

/// A circle of imports, if there is one, as `a → b → … → a`.
fn find_circle(graph: &Graph) -> Option<String> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        New,
        Open,
        Done,
    }
    fn visit(m: &Module, graph: &Graph, marks: &mut BTreeMap<Module, Mark>, trail: &mut Vec<Module>) -> Option<String> {
        marks.insert(m.clone(), Mark::Open);
        trail.push(m.clone());
        for next in graph.get(m).into_iter().flatten() {
            match marks.get(next).copied().unwrap_or(Mark::New) {
                Mark::Open => {
                    let from = trail.iter().position(|t| t == next).unwrap();
                    let mut circle: Vec<String> = trail[from..].iter().map(name).collect();
                    circle.push(name(next));
                    return Some(circle.join(" → "));
                }
                Mark::New => {
                    if let Some(c) = visit(next, graph, marks, trail) {
                        return Some(c);
                    }
                }
                Mark::Done => {}
            }
        }
        trail.pop();
        marks.insert(m.clone(), Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    for m in graph.keys() {
        if marks.get(m).copied().unwrap_or(Mark::New) == Mark::New {
            if let Some(c) = visit(m, graph, &mut marks, &mut Vec::new()) {
                return Some(c);
            }
        }
    }
    None
}

/// The graph of top-level modules: every file counts as the module its folder (or it) is.
fn top_level(graph: &Graph) -> Graph {
    let top = |m: &Module| m.iter().take(1).cloned().collect::<Module>();
    let mut out = Graph::new();
    for (from, edges) in graph {
        let entry = out.entry(top(from)).or_default();
        entry.extend(edges.iter().map(top).filter(|to| *to != top(from)));
    }
    out
}

/// The graph of files without the edges between a module and the folder it is in.
fn between_siblings(graph: &Graph) -> Graph {
    let nested = |a: &Module, b: &Module| a.starts_with(b) || b.starts_with(a);
    graph
        .iter()
        .map(|(from, edges)| {
            (
                from.clone(),
                edges.iter().filter(|to| !nested(from, to)).cloned().collect(),
            )
        })
        .collect()
}

/// The circle of imports in `src`, if there is one.
fn circle_in(src: &Path) -> Option<String> {
    let files = graph(src);
    find_circle(&top_level(&files)).or_else(|| find_circle(&between_siblings(&files)))
}

#[test]
fn no_two_modules_import_each_other() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let graph = graph(&src);
    assert!(
        graph.len() > 20,
        "read the modules of src/: {:?}",
        graph.keys().collect::<Vec<_>>()
    );
    if let Some(circle) = circle_in(&src) {
        panic!("modules of src/ import each other in a circle: {circle}");
    }
}

/// The check itself can fail: a circle through a grouped `use`, `super` and a re-export is found.
#[test]
fn the_check_finds_a_circle() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    std::fs::create_dir_all(src.join("up")).unwrap();
    let files = [
        ("lib.rs", "mod a;\nmod b;\nmod up;\n"),
        ("a.rs", "use crate::{b::Thing, up};\n"),
        ("b.rs", "// use crate::a; (a comment is no import)\npub struct Thing;\n"),
        ("up/mod.rs", "mod pool;\npub use pool::Pool;\n"),
        (
            "up/pool.rs",
            "pub struct Pool;\nfn f() { let _ = super::super::b::Thing; }\n",
        ),
    ];
    for (path, text) in files {
        std::fs::write(src.join(path), text).unwrap();
    }
    assert_eq!(circle_in(src), None);
    std::fs::write(src.join("b.rs"), "pub struct Thing;\nuse crate::up::Pool;\n").unwrap();
    std::fs::write(src.join("up/pool.rs"), "pub struct Pool;\nuse crate::a as _;\n").unwrap();
    assert_eq!(circle_in(src).as_deref(), Some("a → b → up → a"));
    // Between two files of one folder.
    std::fs::write(src.join("up/pool.rs"), "pub struct Pool;\nuse super::conn::Conn;\n").unwrap();
    std::fs::write(
        src.join("up/conn.rs"),
        "pub struct Conn;\nfn f() { let _ = super::pool::Pool; }\n",
    )
    .unwrap();
    std::fs::write(src.join("b.rs"), "pub struct Thing;\n").unwrap();
    let circle = circle_in(src).expect("up::conn → up::pool → up::conn");
    assert!(
        circle.contains("up::conn → up::pool") || circle.contains("up::pool → up::conn"),
        "{circle}"
    );
}

/// Every top-level entry of `src/` as the code map names it: a file as `name.rs`, a folder as
/// `name/`, with its path.
fn top_level_entries(src: &Path) -> BTreeMap<String, PathBuf> {
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(src).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            out.insert(format!("{name}/"), path);
        } else if name.ends_with(".rs") {
            out.insert(name, path);
        }
    }
    out
}

/// What a code map names: every backticked name in the headings (`###` and deeper) of the
/// text's `## Code map` section (fenced code skipped); a heading may name several. `None`
/// without such a section.
fn code_map(text: &str) -> Option<BTreeSet<String>> {
    let mut lines = text.lines().skip_while(|l| l.trim_end() != "## Code map");
    lines.next()?;
    let mut named = BTreeSet::new();
    let mut fenced = false;
    for line in lines {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        if line.starts_with("## ") {
            break;
        }
        if !line.starts_with("###") {
            continue;
        }
        // Between the backticks: the odd pieces of the heading split at them.
        named.extend(line.split('`').skip(1).step_by(2).map(str::to_string));
    }
    Some(named)
}

/// What is wrong with `architecture`'s code map of the top level of `src`, one line each.
fn code_map_problems(src: &Path, architecture: &str) -> Vec<String> {
    let Some(named) = code_map(architecture) else {
        return vec!["ARCHITECTURE.md has no \"## Code map\" section".to_string()];
    };
    let entries = top_level_entries(src);
    let mut problems: Vec<String> = entries
        .keys()
        .filter(|e| !named.contains(*e))
        .map(|e| {
            format!(
                "ARCHITECTURE.md's code map does not name `{e}` (src/{e}): name it in a heading (### `{e}`) saying what it owns and must never do"
            )
        })
        .collect();
    problems.extend(
        named
            .iter()
            .filter(|n| !entries.contains_key(*n))
            .map(|n| format!("ARCHITECTURE.md's code map names `{n}`, which is no file or folder of src/")),
    );
    problems
}

#[test]
fn the_code_map_names_every_top_level_module_and_no_other() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let entries = top_level_entries(&root.join("src"));
    assert!(
        entries.len() > 20 && entries.contains_key("lib.rs") && entries.contains_key("upstream/"),
        "read the top level of src/: {:?}",
        entries.keys().collect::<Vec<_>>()
    );
    let architecture = std::fs::read_to_string(root.join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let problems = code_map_problems(&root.join("src"), &architecture);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The check itself can fail: an entry the map leaves out, and one it names that is not there,
/// are each named; headings in code blocks and other sections, and names outside headings, do
/// not count; a heading may name several entries.
#[test]
fn the_code_map_check_finds_a_missing_and_an_extra_module() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    std::fs::create_dir_all(src.join("up")).unwrap();
    for file in ["lib.rs", "main.rs", "a.rs", "up/mod.rs", "up/pool.rs", "notes.txt"] {
        std::fs::write(src.join(file), "").unwrap();
    }
    let map = |entries: &str| format!("# Architecture\n\n## Code map\n\n{entries}\n## Invariants\n\n### `gone.rs`\n");
    let whole = "### `lib.rs`, `main.rs`\n### `a.rs`\nSee `up/`.\n### `up/`\n";
    assert_eq!(code_map_problems(src, &map(whole)), Vec::<String>::new());

    let problems = code_map_problems(
        src,
        &map("### `lib.rs`, `main.rs`\n### `a.rs`\nSee `up/`.\n```\n### `up/`\n```\n"),
    );
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].contains("`up/` (src/up/)"), "{problems:?}");

    let problems = code_map_problems(src, &map(&format!("{whole}#### `up/pool.rs`\n")));
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].contains("`up/pool.rs`, which is no file or folder"),
        "{problems:?}"
    );

    assert_eq!(code_map_problems(src, "# Architecture\n").len(), 1);
}

/// Each function of a file's code (unit tests left out) with the lines it spans: from its
/// `fn` line to its closing brace. Comments, strings and character literals are skipped, so a
/// brace in them counts for nothing.
fn function_lengths(text: &str) -> Vec<(String, usize)> {
    let code = match text.find("#[cfg(test)]\nmod tests") {
        Some(at) => &text[..at],
        None => text,
    };
    let chars: Vec<char> = code.chars().collect();
    let (mut line, mut depth, mut i) = (1usize, 0usize, 0usize);
    // Open functions: name, line of `fn`, the depth its body opens at (set at its `{`).
    let mut open: Vec<(String, usize, Option<usize>)> = Vec::new();
    let mut out = Vec::new();
    while i < chars.len() {
        let c = chars[i];
        match c {
            '\n' => line += 1,
            '/' if chars.get(i + 1) == Some(&'/') => {
                while i + 1 < chars.len() && chars[i + 1] != '\n' {
                    i += 1;
                }
            }
            '"' => {
                i += 1;
                while i < chars.len() && chars[i] != '"' {
                    if chars[i] == '\n' {
                        line += 1;
                    }
                    i += if chars[i] == '\\' { 2 } else { 1 };
                }
            }
            // A character literal ('{', '\n'), not a lifetime ('a).
            '\'' if chars.get(i + 2) == Some(&'\'') => i += 2,
            '\'' if chars.get(i + 1) == Some(&'\\') => {
                while i + 1 < chars.len() && chars[i + 1] != '\'' {
                    i += 1;
                }
                i += 1;
            }
            '{' => {
                if let Some(f) = open.last_mut().filter(|f| f.2.is_none()) {
                    f.2 = Some(depth);
                }
                depth += 1;
            }
            '}' => {
                depth -= 1;
                if open.last().is_some_and(|f| f.2 == Some(depth)) {
                    let (name, from, _) = open.pop().expect("an open function");
                    out.push((name, line - from + 1));
                }
            }
            // A declaration without a body (in a trait) ends at its `;`.
            ';' if open.last().is_some_and(|f| f.2.is_none()) => {
                open.pop();
            }
            _ if c.is_alphanumeric() || c == '_' => {
                let start = i;
                while i + 1 < chars.len() && (chars[i + 1].is_alphanumeric() || chars[i + 1] == '_') {
                    i += 1;
                }
                let word: String = chars[start..=i].iter().collect();
                let before = start.checked_sub(1).map(|b| chars[b]);
                if word == "fn" && !before.is_some_and(|b| b.is_alphanumeric() || b == '_') {
                    let name: String = chars[i + 1..]
                        .iter()
                        .skip_while(|c| c.is_whitespace())
                        .take_while(|c| c.is_alphanumeric() || **c == '_')
                        .collect();
                    // `fn(` is a function pointer type, not a function.
                    if !name.is_empty() {
                        open.push((name, line, None));
                    }
                }
            }
            _ => {}
        }
        i += 1;
    }
    out
}

/// Files read in one sitting, functions that fit on a screen or two: no file of `src/` over
/// 600 lines, no function over 80 lines in `src/proxy/` (the request path) or 150 elsewhere.
/// The metric registration (one long list of declarations) and unit tests are left out.
#[test]
fn files_and_functions_stay_short() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut long = Vec::new();
    for (_, path) in source_files(&src) {
        let text = std::fs::read_to_string(&path).unwrap();
        let rel = path.strip_prefix(&src).unwrap().to_string_lossy().replace('\\', "/");
        let lines = text.lines().count();
        if lines > 600 {
            long.push(format!("{rel}: {lines} lines"));
        }
        let limit = if rel.starts_with("proxy/") { 80 } else { 150 };
        let unit_tests = rel.contains("tests/") || rel.ends_with("tests.rs");
        for (name, n) in function_lengths(&text).into_iter().filter(|_| !unit_tests) {
            if n > limit && !(rel == "metrics.rs" && name == "new") {
                long.push(format!("{rel}: fn {name} is {n} lines (at most {limit})"));
            }
        }
    }
    assert!(long.is_empty(), "too long to read in one sitting:\n{}", long.join("\n"));
}

#[test]
fn the_length_check_counts_bodies_not_braces_in_text() {
    let text = "fn a() {\n    let c = '{';\n    let s = \"}}\";\n    // }\n}\ntrait T { fn b(&self); }\nfn c<'x>(v: &'x str) -> fn() {\n    todo!()\n}\n";
    assert_eq!(function_lengths(text), [("a".to_string(), 5), ("c".to_string(), 3)]);
}
