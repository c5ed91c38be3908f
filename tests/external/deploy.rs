//! deploy/: the container image, the Kubernetes manifests, the systemd unit, the Grafana
//! dashboard and the Prometheus rules, each checked by the tool that consumes it (docs/src/deploying.md).
//!
//! Needs kubectl (with kustomize), promtool (Debian package `prometheus`), systemd-analyze, and
//! the Python venv of tests/deploy/setup_venv.sh (kubernetes-validate and the CRD models), which
//! scripts/test.sh installs when missing. A missing tool fails these tests; none is skipped.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::time::Duration;

use crate::support::*;
use bytes::Bytes;
use http::Method;
use serde_json::{json, Value};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(repo().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// A tool from PATH (or from the environment variable `var`), or a failure saying how to get it.
fn tool(name: &str, var: &str, hint: &str) -> PathBuf {
    if let Some(p) = std::env::var_os(var) {
        return PathBuf::from(p);
    }
    std::env::var_os("PATH")
        .and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|d| d.join(name))
                .find(|p| p.is_file())
        })
        .unwrap_or_else(|| panic!("{name} not found on PATH (nor ${var}): {hint}"))
}

fn kubectl() -> PathBuf {
    tool("kubectl", "MRTR_KUBECTL", "install kubectl (kustomize is built in)")
}

fn promtool() -> PathBuf {
    tool(
        "promtool",
        "MRTR_PROMTOOL",
        "apt-get install prometheus (scripts/test.sh does)",
    )
}

fn systemd_analyze() -> PathBuf {
    tool("systemd-analyze", "MRTR_SYSTEMD_ANALYZE", "apt-get install systemd")
}

fn python() -> PathBuf {
    let py = std::env::var_os("MRTR_DEPLOY_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join(".venv-deploy/bin/python"));
    assert!(
        py.exists(),
        "{} is missing: run `bash tests/deploy/setup_venv.sh` (scripts/test.sh does) to install kubernetes-validate",
        py.display()
    );
    py
}

/// Runs `cmd` and returns its output; fails with both streams unless it exits 0.
fn run_ok(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A YAML file as JSON, through the deploy venv's PyYAML (the crate has no YAML parser).
fn yaml(rel: &str) -> Value {
    let out = run_ok(
        Command::new(python())
            .args([
                "-c",
                "import json, sys, yaml; json.dump(yaml.safe_load(open(sys.argv[1])), sys.stdout)",
            ])
            .arg(repo().join(rel)),
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// `mrtr-router check` on `config` with `env`: the effective config it prints.
fn check_config(config: &Path, env: &[(&str, &str)]) -> toml::Table {
    let mut cmd = Command::new(bin());
    cmd.args(["check", "--config"])
        .arg(config)
        .env_remove("MRTR_TOKEN_KEY")
        .env_remove("MRTR_ADMIN_TOKEN");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = run_ok(&mut cmd);
    let text = String::from_utf8(out.stdout).unwrap();
    text.parse::<toml::Table>()
        .unwrap_or_else(|e| panic!("check printed no TOML ({e}):\n{text}"))
}

fn duration_of(effective: &toml::Table, section: &str, key: &str) -> Duration {
    let v = effective[section][key].as_str().unwrap();
    humantime::parse_duration(v).unwrap_or_else(|e| panic!("{section}.{key} = {v:?}: {e}"))
}

fn port_of(effective: &toml::Table, section: &str) -> u16 {
    let v = effective[section]["listen"].as_str().unwrap();
    v.parse::<SocketAddr>().unwrap().port()
}

const TOKEN_KEY: &str = "deploy-test-token-key-0123456789abcdef";
/// The admin token the Kubernetes config reads from the environment.
const ADMIN_TOKEN: &str = "deploy-test-admin-token";

// ---- Dockerfile -------------------------------------------------------------------------------

/// Instructions of a Dockerfile: (keyword upper-cased, arguments), continuation lines joined.
fn dockerfile(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for line in text.lines() {
        let t = line.trim();
        if cur.is_empty() && (t.is_empty() || t.starts_with('#')) {
            continue;
        }
        if let Some(head) = t.strip_suffix('\\') {
            cur.push_str(head);
            cur.push(' ');
            continue;
        }
        cur.push_str(t);
        let (k, rest) = cur.split_once(char::is_whitespace).unwrap_or((&cur, ""));
        out.push((k.to_uppercase(), rest.trim().to_string()));
        cur.clear();
    }
    out
}

#[test]
fn dockerfile_pins_its_bases_runs_unprivileged_and_builds_with_the_tested_toolchain() {
    let text = read("deploy/docker/Dockerfile");
    let ins = dockerfile(&text);
    let froms: Vec<&String> = ins.iter().filter(|(k, _)| k == "FROM").map(|(_, a)| a).collect();
    assert!(froms.len() >= 2, "multi-stage: {froms:?}");
    for from in &froms {
        let mut parts = from.split_whitespace();
        let image = parts.next().unwrap();
        // A base is named by tag AND digest; no variables, no `latest`.
        let (named, digest) = image
            .split_once("@sha256:")
            .unwrap_or_else(|| panic!("FROM {image}: not pinned by digest"));
        assert!(
            digest.len() == 64 && digest.chars().all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c)),
            "FROM {image}: digest"
        );
        let last = named.rsplit('/').next().unwrap();
        let (_, tag) = last.split_once(':').unwrap_or_else(|| panic!("FROM {image}: no tag"));
        assert!(
            !tag.is_empty() && !tag.contains("latest") && !image.contains('$'),
            "FROM {image}"
        );
        if let Some(as_) = parts.next() {
            assert!(as_.eq_ignore_ascii_case("as") && parts.next().is_some(), "FROM {from}");
        }
    }
    // The builder is the Rust release the tests run with.
    let rustc = Command::new(std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into()))
        .arg("--version")
        .output()
        .expect("rustc");
    let rustc = String::from_utf8(rustc.stdout).unwrap();
    let version = rustc.split_whitespace().nth(1).expect("rustc X.Y.Z");
    let builder = froms[0].split_whitespace().next().unwrap();
    assert!(
        builder.contains(&format!("/rust:{version}-")),
        "the build stage ({builder}) is not the toolchain the tests use ({}): bump its tag and digest",
        rustc.trim()
    );

    // The runtime stage: after the last FROM.
    let last_from = ins.iter().rposition(|(k, _)| k == "FROM").unwrap();
    let last = &ins[last_from..];
    let arg = |k: &str| last.iter().rev().find(|(kk, _)| kk == k).map(|(_, a)| a.clone());
    let user = arg("USER").expect("the runtime stage sets USER");
    let uid = user.split(':').next().unwrap();
    assert!(
        uid.parse::<u32>().is_ok_and(|u| u != 0),
        "USER {user}: a numeric non-root uid (Kubernetes runAsNonRoot checks it)"
    );
    assert_eq!(arg("STOPSIGNAL").as_deref(), Some("SIGTERM"));
    let exposed: BTreeSet<u16> = arg("EXPOSE")
        .expect("EXPOSE")
        .split_whitespace()
        .map(|p| p.trim_end_matches("/tcp").parse().unwrap())
        .collect();
    let base = check_config(
        &repo().join("deploy/kubernetes/base/config.toml"),
        &[("MRTR_TOKEN_KEY", TOKEN_KEY), ("MRTR_ADMIN_TOKEN", ADMIN_TOKEN)],
    );
    let ports = BTreeSet::from([port_of(&base, "server"), port_of(&base, "admin")]);
    assert_eq!(
        exposed, ports,
        "EXPOSE = the proxy and admin ports of the Kubernetes config"
    );
    let entry: Vec<String> = serde_json::from_str(&arg("ENTRYPOINT").unwrap()).expect("ENTRYPOINT in exec form");
    let cmd: Vec<String> = serde_json::from_str(&arg("CMD").unwrap()).expect("CMD in exec form");
    assert_eq!(cmd, ["--config", "/etc/mrtr-router/config.toml"]);
    let copied: Vec<String> = last
        .iter()
        .filter(|(k, a)| k == "COPY" && a.starts_with("--from="))
        .map(|(_, a)| a.split_whitespace().last().unwrap().to_string())
        .collect();
    assert!(
        copied.contains(&entry[0]),
        "ENTRYPOINT {entry:?} is what the build stage copied: {copied:?}"
    );

    // The build: scripts/build-optimized.sh (PGO and BOLT on the release profile, exactly
    // Cargo.lock).
    let builds: Vec<&String> = ins
        .iter()
        .filter(|(k, a)| k == "RUN" && (a.contains("cargo build") || a.contains("build-optimized")))
        .map(|(_, a)| a)
        .collect();
    assert_eq!(builds, ["scripts/build-optimized.sh"]);
    assert!(read("scripts/build-optimized.sh").contains("cargo build --release --locked --quiet --bin mrtr-router"));

    // The build context: .dockerignore lets in exactly what the build stage copies, and that is
    // a complete cargo package whose lock file is up to date (what `--locked` needs).
    let sources: BTreeSet<String> = ins[..last_from]
        .iter()
        .filter(|(k, a)| k == "COPY" && !a.starts_with("--"))
        .flat_map(|(_, a)| {
            let words: Vec<&str> = a.split_whitespace().collect();
            words[..words.len() - 1]
                .iter()
                .map(|w| w.trim_end_matches('/').to_string())
                .collect::<Vec<_>>()
        })
        .collect();
    let ignore = read(".dockerignore");
    let patterns: Vec<&str> = ignore
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    assert_eq!(
        patterns.first(),
        Some(&"*"),
        ".dockerignore starts by excluding everything"
    );
    let let_in: BTreeSet<String> = patterns[1..]
        .iter()
        .map(|p| {
            p.strip_prefix('!')
                .expect("then only re-includes")
                .trim_end_matches('/')
                .to_string()
        })
        .collect();
    assert_eq!(let_in, sources, ".dockerignore re-includes exactly the COPY sources");
    let ctx = tempfile::tempdir().unwrap();
    for s in &sources {
        copy_tree(&repo().join(s), &ctx.path().join(s));
    }
    // Every target the manifest declares has its source in the context (cargo refuses to build
    // a package with a declared bench or example missing, whichever target is asked for).
    let manifest: toml::Table = read("Cargo.toml").parse().unwrap();
    let mut declared = vec![PathBuf::from("src/lib.rs"), PathBuf::from("src/main.rs")];
    for (kind, dir) in [
        ("bin", "src/bin"),
        ("example", "examples"),
        ("test", "tests"),
        ("bench", "benches"),
    ] {
        for t in manifest.get(kind).and_then(|v| v.as_array()).into_iter().flatten() {
            let name = t["name"].as_str().unwrap();
            declared.push(match t.get("path") {
                Some(p) => PathBuf::from(p.as_str().unwrap()),
                None => PathBuf::from(format!("{dir}/{name}.rs")),
            });
        }
    }
    for d in &declared {
        assert!(
            ctx.path().join(d).is_file(),
            "the build context lacks {} (Cargo.toml needs it)",
            d.display()
        );
    }
    // The lock file is current for that context: `cargo tree --locked` resolves it offline for
    // the host, as `cargo build --locked` does (a stale Cargo.lock fails here).
    let host = Command::new(std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into()))
        .arg("-vV")
        .output()
        .unwrap();
    let host = String::from_utf8(host.stdout).unwrap();
    let host = host
        .lines()
        .find_map(|l| l.strip_prefix("host: "))
        .expect("rustc -vV host");
    run_ok(
        Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .args(["tree", "--locked", "--offline", "-e", "normal,build", "--target", host])
            .current_dir(ctx.path()),
    );
}

fn copy_tree(from: &Path, to: &Path) {
    if from.is_dir() {
        std::fs::create_dir_all(to).unwrap();
        for e in std::fs::read_dir(from).unwrap() {
            let e = e.unwrap();
            copy_tree(&e.path(), &to.join(e.file_name()));
        }
    } else {
        // A single file may sit in a directory the context has nothing else of (scripts/).
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(from, to).unwrap_or_else(|e| panic!("{}: {e}", from.display()));
    }
}

// ---- Kubernetes --------------------------------------------------------------------------------

/// The path of a temporary directory under the repository's target/, relative to the repository
/// (kustomize takes only relative paths to other kustomizations).
fn temp_in_target(prefix: &str) -> (tempfile::TempDir, String) {
    let target = repo().join("target");
    std::fs::create_dir_all(&target).unwrap();
    let dir = tempfile::Builder::new().prefix(prefix).tempdir_in(&target).unwrap();
    let rel = format!("target/{}", dir.path().file_name().unwrap().to_str().unwrap());
    (dir, rel)
}

/// `kubectl kustomize` + validation of each directory (tests/deploy/k8s_validate.py): the
/// rendered objects of each, or a failure with the validator's log.
fn render_and_validate(dirs: &[&str]) -> BTreeMap<String, Vec<Value>> {
    let out = Command::new(python())
        .arg(repo().join("tests/deploy/k8s_validate.py"))
        .arg("--kubectl")
        .arg(kubectl())
        .args(["--versions", "1.30.0,1.37.0"])
        .args(dirs)
        .current_dir(repo())
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "kustomize render or validation failed:\n{log}");
    serde_json::from_slice(&out.stdout).unwrap()
}

fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind}/{name}"))
}

fn has_kind(objects: &[Value], kind: &str) -> bool {
    objects.iter().any(|o| o["kind"] == kind)
}

/// Whether `selector` (matchLabels, or a Service's selector map) selects `labels`.
fn selects(selector: &Value, labels: &Value) -> bool {
    let map = selector.get("matchLabels").unwrap_or(selector);
    let map = map.as_object().expect("a label selector");
    !map.is_empty() && map.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// The ConfigMap's config.toml, checked by the router in `dir`, laid out like the pod's
/// /etc/mrtr-router (with TLS files when the config names them): its effective config and text.
fn check_configmap(objects: &[Value], dir: &Path) -> (toml::Table, String) {
    let cm = find(objects, "ConfigMap", "mrtr-router");
    let text = cm["data"]["config.toml"]
        .as_str()
        .expect("config.toml in the ConfigMap");
    std::fs::create_dir_all(dir).unwrap();
    let path = dir.join("config.toml");
    std::fs::write(&path, text).unwrap();
    if text.contains("\ntls_cert") {
        let rcgen::CertifiedKey { cert, signing_key } =
            rcgen::generate_simple_self_signed(vec!["mcp.example.com".to_string()]).unwrap();
        std::fs::create_dir_all(dir.join("tls")).unwrap();
        std::fs::write(dir.join("tls/tls.crt"), cert.pem()).unwrap();
        std::fs::write(dir.join("tls/tls.key"), signing_key.serialize_pem()).unwrap();
    }
    // The token key comes from the environment: without it the config is refused.
    let bare = Command::new(bin())
        .args(["check", "--config"])
        .arg(&path)
        .env_remove("MRTR_TOKEN_KEY")
        .env("MRTR_ADMIN_TOKEN", ADMIN_TOKEN)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&bare.stderr);
    assert!(
        !bare.status.success() && err.contains("MRTR_TOKEN_KEY is not set"),
        "{err}"
    );
    let env = [("MRTR_TOKEN_KEY", TOKEN_KEY), ("MRTR_ADMIN_TOKEN", ADMIN_TOKEN)];
    (check_config(&path, &env), text.to_string())
}

#[test]
fn kubernetes_manifests_render_validate_and_have_the_production_properties() {
    // The base, each overlay, and both components at once (an overlay under target/).
    let (combo, combo_rel) = temp_in_target("deploy-k8s-");
    std::fs::write(
        combo.path().join("kustomization.yaml"),
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [../../deploy/kubernetes/base]\n\
         components: [../../deploy/kubernetes/components/tls, ../../deploy/kubernetes/components/hpa]\n",
    )
    .unwrap();
    let dirs = [
        "deploy/kubernetes",
        "deploy/kubernetes/overlays/tls",
        "deploy/kubernetes/overlays/hpa",
        combo_rel.as_str(),
    ];
    let rendered = render_and_validate(&dirs);
    assert_eq!(rendered.len(), dirs.len());
    let tmp = tempfile::tempdir().unwrap();
    for (dir, objects) in &rendered {
        let variant = if *dir == combo_rel { "tls+hpa" } else { dir.as_str() };
        let ctx = |what: &str| format!("{variant}: {what}");
        let tls = variant.contains("tls");
        let hpa = variant.contains("hpa");
        let config_dir = tmp.path().join(variant.replace('/', "_"));
        let (effective, config_text) = check_configmap(objects, &config_dir);

        let deploy = find(objects, "Deployment", "mrtr-router");
        let spec = &deploy["spec"];
        let pod = &spec["template"]["spec"];
        let pod_labels = &spec["template"]["metadata"]["labels"];
        assert!(selects(&spec["selector"], pod_labels), "{}", ctx("selector"));

        // Replicas: at least two, fixed or by the HPA.
        if hpa {
            assert!(
                spec.get("replicas").is_none(),
                "{}",
                ctx("the HPA owns the replica count")
            );
            let h = find(objects, "HorizontalPodAutoscaler", "mrtr-router");
            assert_eq!(h["spec"]["scaleTargetRef"]["kind"], "Deployment");
            assert_eq!(h["spec"]["scaleTargetRef"]["name"], "mrtr-router");
            assert!(
                h["spec"]["minReplicas"].as_u64().unwrap() >= 2,
                "{}",
                ctx("minReplicas")
            );
        } else {
            assert!(spec["replicas"].as_u64().unwrap() >= 2, "{}", ctx("replicas >= 2"));
            assert!(!has_kind(objects, "HorizontalPodAutoscaler"));
        }

        let containers = pod["containers"].as_array().unwrap();
        assert_eq!(containers.len(), 1);
        let c = &containers[0];
        let image = c["image"].as_str().unwrap();
        let tag = image
            .rsplit('/')
            .next()
            .unwrap()
            .split_once(':')
            .map(|(_, t)| t)
            .unwrap_or("");
        assert!(!tag.is_empty() && tag != "latest", "{}", ctx(image));

        // Ports: the config's listeners, on the pod address; probes on the admin port.
        let port = |name: &str| {
            c["ports"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["name"] == name)
                .unwrap_or_else(|| panic!("{}", ctx(&format!("container port {name}"))))["containerPort"]
                .as_u64()
                .unwrap() as u16
        };
        assert_eq!(port("mcp"), port_of(&effective, "server"), "{}", ctx("mcp port"));
        assert_eq!(port("admin"), port_of(&effective, "admin"), "{}", ctx("admin port"));
        for section in ["server", "admin"] {
            let addr: SocketAddr = effective[section]["listen"].as_str().unwrap().parse().unwrap();
            assert!(addr.ip().is_unspecified(), "{}", ctx("listeners on the pod address"));
        }
        for (probe, path) in [("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")] {
            let get = &c[probe]["httpGet"];
            assert_eq!(get["path"], path, "{}", ctx(probe));
            assert!(
                get["port"] == "admin" || get["port"] == port("admin"),
                "{}",
                ctx(&format!("{probe} on the admin port"))
            );
        }

        // The config file: mounted where the args say, from the ConfigMap.
        let args: Vec<&str> = c["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
        assert_eq!(args, ["--config", "/etc/mrtr-router/config.toml"]);
        let mount = c["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["mountPath"] == "/etc/mrtr-router")
            .expect("config mount");
        let volume = pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == mount["name"])
            .expect("config volume");
        let sources = volume["projected"]["sources"].as_array().expect("a projected volume");
        assert!(sources.iter().any(|s| s["configMap"]["name"] == "mrtr-router"));
        // Readable by the router's user: through fsGroup when the mode keeps others out.
        let mode = volume["projected"]["defaultMode"].as_u64().unwrap_or(0o644);
        let group_reads = mode & 0o040 != 0 && pod["securityContext"]["fsGroup"].is_u64();
        assert!(
            mode & 0o004 != 0 || group_reads,
            "{}",
            ctx("the config volume is unreadable")
        );

        // Secrets: every ${VAR} of the config is an env var of the container from a Secret
        // (required); the token key is the Secret mrtr-router's token-key.
        let env = c["env"].as_array().unwrap();
        let mut vars = Vec::new();
        let mut rest = config_text.as_str();
        while let Some(i) = rest.find("${") {
            let end = i + rest[i..].find('}').unwrap();
            vars.push(rest[i + 2..end].to_string());
            rest = &rest[end..];
        }
        assert!(vars.iter().any(|v| v == "MRTR_TOKEN_KEY"), "{}", ctx("tokens.keys"));
        assert!(effective["tokens"]["keys"].as_array().is_some_and(|k| !k.is_empty()));
        for v in &vars {
            let e = env
                .iter()
                .find(|e| e["name"] == v.as_str())
                .unwrap_or_else(|| panic!("{}", ctx(&format!("env {v}"))));
            let r = &e["valueFrom"]["secretKeyRef"];
            assert!(
                r["name"].is_string() && r["key"].is_string(),
                "{}",
                ctx(&format!("{v} from a Secret"))
            );
            assert_ne!(r["optional"], true, "{}", ctx(&format!("{v} optional")));
        }
        let key = &env.iter().find(|e| e["name"] == "MRTR_TOKEN_KEY").unwrap()["valueFrom"]["secretKeyRef"];
        assert_eq!(key, &json!({"name": "mrtr-router", "key": "token-key"}));
        // The admin listener is on the pod address: drains need the admin token, from the Secret.
        assert_eq!(
            effective["admin"]["token"].as_str(),
            Some("<redacted>"),
            "{}",
            ctx("admin.token")
        );
        let admin = env.iter().find(|e| e["name"] == "MRTR_ADMIN_TOKEN");
        let admin = &admin.unwrap_or_else(|| panic!("{}", ctx("env MRTR_ADMIN_TOKEN")))["valueFrom"]["secretKeyRef"];
        assert_eq!(admin, &json!({"name": "mrtr-router", "key": "admin-token"}));

        // Shutdown: SIGTERM after the preStop sleep, then shutdown_grace within the grace period.
        let grace = pod["terminationGracePeriodSeconds"].as_u64().unwrap();
        let pre_stop = c["lifecycle"]["preStop"]["sleep"]["seconds"]
            .as_u64()
            .unwrap_or_else(|| panic!("{}", ctx("a preStop sleep")));
        assert!(
            pre_stop >= 5,
            "{}",
            ctx("preStop long enough for the endpoints to update")
        );
        let shutdown = duration_of(&effective, "server", "shutdown_grace").as_secs();
        assert!(
            grace > pre_stop + shutdown,
            "{}",
            ctx(&format!(
                "terminationGracePeriodSeconds {grace} > preStop {pre_stop} + shutdown_grace {shutdown}"
            ))
        );

        for kind in ["requests", "limits"] {
            for r in ["cpu", "memory"] {
                assert!(
                    c["resources"][kind][r].is_string(),
                    "{}",
                    ctx(&format!("resources.{kind}.{r}"))
                );
            }
        }

        // Security context (the container's fields, or the pod's where Kubernetes has them).
        let sc = &c["securityContext"];
        let psc = &pod["securityContext"];
        let either = |k: &str| if sc.get(k).is_some() { &sc[k] } else { &psc[k] };
        assert_eq!(either("runAsNonRoot"), true, "{}", ctx("runAsNonRoot"));
        assert!(
            either("runAsUser").as_u64().is_none_or(|u| u != 0),
            "{}",
            ctx("runAsUser")
        );
        assert_eq!(sc["readOnlyRootFilesystem"], true, "{}", ctx("readOnlyRootFilesystem"));
        assert_eq!(
            sc["allowPrivilegeEscalation"],
            false,
            "{}",
            ctx("allowPrivilegeEscalation")
        );
        assert_ne!(sc["privileged"], true);
        assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]), "{}", ctx("drop ALL"));
        assert!(
            sc["capabilities"].get("add").is_none(),
            "{}",
            ctx("no capability added")
        );
        assert_eq!(either("seccompProfile")["type"], "RuntimeDefault", "{}", ctx("seccomp"));
        assert_eq!(pod["automountServiceAccountToken"], false);

        // Spread over nodes.
        let spread = pod["topologySpreadConstraints"]
            .as_array()
            .expect("topologySpreadConstraints");
        let by_node = spread
            .iter()
            .find(|t| t["topologyKey"] == "kubernetes.io/hostname")
            .unwrap_or_else(|| panic!("{}", ctx("spread across nodes")));
        assert!(selects(&by_node["labelSelector"], pod_labels));
        assert_eq!(by_node["maxSkew"], 1);

        // Services: the public one has the proxy port only; the admin one feeds the ServiceMonitor.
        let public = find(objects, "Service", "mrtr-router");
        assert!(selects(&public["spec"]["selector"], pod_labels));
        let targets: Vec<&Value> = public["spec"]["ports"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| &p["targetPort"])
            .collect();
        assert_eq!(
            targets,
            [&json!("mcp")],
            "{}",
            ctx("the public Service has the proxy port only")
        );
        if tls {
            assert_eq!(public["spec"]["ports"][0]["port"], 443);
        }
        let admin = find(objects, "Service", "mrtr-router-admin");
        assert!(selects(&admin["spec"]["selector"], pod_labels));
        assert_eq!(admin["spec"]["ports"][0]["targetPort"], "admin");
        let sm = find(objects, "ServiceMonitor", "mrtr-router");
        assert!(selects(&sm["spec"]["selector"], &admin["metadata"]["labels"]));
        assert!(
            !selects(&sm["spec"]["selector"], &public["metadata"]["labels"]),
            "{}",
            ctx("the ServiceMonitor picks the admin Service only")
        );
        let sm_port = &sm["spec"]["endpoints"][0]["port"];
        assert!(admin["spec"]["ports"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| &p["name"] == sm_port));
        assert_eq!(sm["spec"]["endpoints"][0]["path"], "/metrics");
        let ann = &spec["template"]["metadata"]["annotations"];
        assert_eq!(ann["prometheus.io/scrape"], "true");
        assert_eq!(ann["prometheus.io/port"], port("admin").to_string());
        assert_eq!(ann["prometheus.io/path"], "/metrics");

        // Discovery: the config's DNS name is the workers' headless Service, on its port.
        let dns = effective["discovery"]["dns"].as_str().expect("[discovery] dns");
        let (host, dport) = dns.rsplit_once(':').unwrap();
        let workers = find(objects, "Service", host.split('.').next().unwrap());
        assert_eq!(
            workers["spec"]["clusterIP"],
            "None",
            "{}",
            ctx("headless workers Service")
        );
        assert!(workers["spec"]["selector"].as_object().is_some_and(|s| !s.is_empty()));
        assert_ne!(workers["spec"]["publishNotReadyAddresses"], true);
        assert!(workers["spec"]["ports"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["port"].as_u64() == dport.parse().ok()));
        assert!(
            !selects(&workers["spec"]["selector"], pod_labels),
            "{}",
            ctx("workers are not routers")
        );

        // Disruptions: one router at a time.
        let pdb = find(objects, "PodDisruptionBudget", "mrtr-router");
        assert!(selects(&pdb["spec"]["selector"], pod_labels));
        assert_eq!(pdb["spec"]["maxUnavailable"], 1);

        // NetworkPolicy: the proxy port is reachable; the admin port only from named peers.
        let np = find(objects, "NetworkPolicy", "mrtr-router");
        assert!(selects(&np["spec"]["podSelector"], pod_labels));
        assert!(np["spec"]["policyTypes"]
            .as_array()
            .unwrap()
            .contains(&json!("Ingress")));
        let rules = np["spec"]["ingress"].as_array().unwrap();
        let allows = |rule: &Value, name: &str, number: u16| {
            rule.get("ports")
                .and_then(Value::as_array)
                .is_none_or(|ps| ps.iter().any(|p| p["port"] == name || p["port"] == number))
        };
        assert!(
            rules.iter().any(|r| allows(r, "mcp", port("mcp"))),
            "{}",
            ctx("proxy port open")
        );
        let admin_rules: Vec<&Value> = rules.iter().filter(|r| allows(r, "admin", port("admin"))).collect();
        assert!(!admin_rules.is_empty(), "{}", ctx("Prometheus reaches the admin port"));
        for r in admin_rules {
            let from = r["from"].as_array().map(Vec::as_slice).unwrap_or_default();
            let narrow = |peer: &Value| {
                peer.as_object().is_some_and(|p| {
                    !p.is_empty()
                        && p.values()
                            .all(|s| s["matchLabels"].as_object().is_some_and(|m| !m.is_empty()))
                })
            };
            assert!(
                !from.is_empty() && from.iter().all(narrow),
                "{}",
                ctx(&format!("an ingress rule opens the admin port to everyone: {r}"))
            );
        }

        // TLS: the certificate Secret is mounted where the config looks for its files.
        if tls {
            let cert = find(objects, "Certificate", "mrtr-router");
            let secret = cert["spec"]["secretName"].as_str().unwrap();
            let s = sources
                .iter()
                .find(|s| s["secret"]["name"] == secret)
                .unwrap_or_else(|| panic!("{}", ctx("the Certificate's Secret in the config volume")));
            let items: BTreeMap<&str, &str> = s["secret"]["items"]
                .as_array()
                .unwrap()
                .iter()
                .map(|i| (i["key"].as_str().unwrap(), i["path"].as_str().unwrap()))
                .collect();
            for (key, file) in [("tls.crt", "tls_cert"), ("tls.key", "tls_key")] {
                let printed = PathBuf::from(effective["server"][file].as_str().unwrap());
                let rel = printed.strip_prefix(&config_dir).expect("relative to the config file");
                assert_eq!(rel, Path::new(items[key]), "{}", ctx(file));
            }
            assert!(!cert["spec"]["dnsNames"].as_array().unwrap().is_empty());
        } else {
            assert!(effective["server"].get("tls_cert").is_none());
            assert!(!has_kind(objects, "Certificate"));
        }
    }
}

#[test]
fn the_manifest_validator_fails_on_broken_objects() {
    // The check above would pass vacuously if the validator let anything through. Each broken
    // object in a kustomization of its own, all judged by one run of the validator (its imports
    // take seconds): each must fail, in its own directory.
    let (dir, _) = temp_in_target("deploy-bad-");
    let cases = [
        ("Deployment", "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\nspec: {selector: {matchLabels: {a: b}}, template: {metadata: {labels: {a: b}}, spec: {containers: [{name: c, image: i, bogus: 1}]}}}\n"),
        ("ServiceMonitor", "apiVersion: monitoring.coreos.com/v1\nkind: ServiceMonitor\nmetadata: {name: s}\nspec: {selector: {matchLabels: {a: b}}, endpoints: [{port: admin, intervall: 5s}]}\n"),
        ("Certificate", "apiVersion: cert-manager.io/v1\nkind: Certificate\nmetadata: {name: c}\nspec: {secretName: s, issuerRef: {name: x}, privateKey: {algorithm: DSA}}\n"),
        ("Widget", "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w}\n"),
    ];
    let dirs: Vec<std::path::PathBuf> = cases
        .iter()
        .map(|(kind, doc)| {
            let case = dir.path().join(kind);
            std::fs::create_dir(&case).unwrap();
            std::fs::write(case.join("kustomization.yaml"), "resources: [o.yaml]\n").unwrap();
            std::fs::write(case.join("o.yaml"), doc).unwrap();
            case
        })
        .collect();
    let out = Command::new(python())
        .arg(repo().join("tests/deploy/k8s_validate.py"))
        .arg("--kubectl")
        .arg(kubectl())
        .args(&dirs)
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "accepted\n{log}");
    for ((kind, _), case) in cases.iter().zip(&dirs) {
        assert!(
            log.contains(&format!("FAIL {}: {kind}/", case.display())),
            "{kind}: {log}"
        );
    }
}

// ---- systemd -----------------------------------------------------------------------------------

/// `key=value` lines of a unit file, in order (a key may repeat).
fn unit_entries(text: &str) -> Vec<(String, String)> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#') && !l.starts_with(';') && !l.starts_with('['))
        .map(|l| {
            let (k, v) = l.split_once('=').unwrap_or_else(|| panic!("unit line {l:?}"));
            (k.trim().to_string(), v.trim().to_string())
        })
        .collect()
}

#[test]
fn systemd_unit_verifies_is_hardened_and_outlasts_shutdown_grace() {
    let text = read("deploy/systemd/mrtr-router.service");
    let entries = unit_entries(&text);
    let one = |k: &str| {
        let all: Vec<&String> = entries.iter().filter(|(kk, _)| kk == k).map(|(_, v)| v).collect();
        assert_eq!(all.len(), 1, "{k}= once: {all:?}");
        all[0].clone()
    };
    for (k, v) in [
        (
            "ExecStart",
            "/usr/local/bin/mrtr-router --config /etc/mrtr-router/config.toml",
        ),
        ("ExecReload", "/bin/kill -HUP $MAINPID"),
        ("KillSignal", "SIGTERM"),
        ("Restart", "on-failure"),
        ("DynamicUser", "yes"),
        ("ProtectSystem", "strict"),
        ("ProtectHome", "yes"),
        ("PrivateTmp", "yes"),
        ("NoNewPrivileges", "yes"),
        ("RestrictAddressFamilies", "AF_INET AF_INET6 AF_UNIX"),
    ] {
        assert_eq!(one(k), v, "{k}");
    }
    let filters: Vec<&str> = entries
        .iter()
        .filter(|(k, _)| k == "SystemCallFilter")
        .map(|(_, v)| v.as_str())
        .collect();
    assert_eq!(filters.first(), Some(&"@system-service"));

    // The sample config passes `check`, and the unit waits longer than its shutdown_grace.
    let effective = check_config(
        &repo().join("deploy/systemd/config.toml"),
        &[("MRTR_TOKEN_KEY", TOKEN_KEY)],
    );
    let stop_text = one("TimeoutStopSec");
    let stop = stop_text
        .parse::<u64>()
        .map(Duration::from_secs)
        .or_else(|_| humantime::parse_duration(&stop_text))
        .unwrap();
    let grace = duration_of(&effective, "server", "shutdown_grace");
    assert!(stop > grace, "TimeoutStopSec {stop:?} > shutdown_grace {grace:?}");
    // No capability unless a listener needs a privileged port.
    if ["server", "admin"].iter().any(|s| port_of(&effective, s) < 1024) {
        assert!(one("CapabilityBoundingSet").contains("CAP_NET_BIND_SERVICE"));
    } else {
        assert_eq!(one("CapabilityBoundingSet"), "", "an empty capability bounding set");
        assert_eq!(one("AmbientCapabilities"), "");
    }
    let admin: SocketAddr = effective["admin"]["listen"].as_str().unwrap().parse().unwrap();
    assert!(
        admin.ip().is_loopback(),
        "the sample keeps the admin listener on loopback"
    );

    // systemd itself: the unit with the built binary and a scratch environment file.
    let dir = tempfile::tempdir().unwrap();
    let env_file = dir.path().join("env");
    std::fs::write(&env_file, format!("MRTR_TOKEN_KEY={TOKEN_KEY}\n")).unwrap();
    let unit = dir.path().join("mrtr-router.service");
    let substituted = text.replace("/usr/local/bin/mrtr-router", bin()).replace(
        "EnvironmentFile=/etc/mrtr-router/env",
        &format!("EnvironmentFile={}", env_file.display()),
    );
    assert!(substituted.contains(&format!("EnvironmentFile={}", env_file.display())));
    std::fs::write(&unit, &substituted).unwrap();
    // The two socket units that hand the router its listeners (socket activation), named as
    // the router looks them up.
    let mut sockets = Vec::new();
    for name in ["proxy", "admin"] {
        let file = format!("mrtr-router-{name}.socket");
        let socket = read(&format!("deploy/systemd/{file}"));
        assert!(socket.contains(&format!("FileDescriptorName={name}\n")), "{file}");
        assert!(socket.contains("Service=mrtr-router.service"), "{file}");
        assert!(text.contains(&file), "the service names {file} in Sockets=");
        std::fs::write(dir.path().join(&file), socket).unwrap();
        sockets.push(dir.path().join(&file));
    }
    let out = run_ok(Command::new(systemd_analyze()).arg("verify").arg(&unit).args(&sockets));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let about_ours: Vec<&str> = stderr.lines().filter(|l| l.contains("mrtr-router")).collect();
    assert!(about_ours.is_empty(), "systemd-analyze verify warns:\n{stderr}");
    // verify reports unknown keys only as warnings: it must complain about a misspelt one.
    let typo = dir.path().join("typo.service");
    std::fs::write(&typo, substituted.replace("ProtectHome=", "ProtectHmoe=")).unwrap();
    let out = Command::new(systemd_analyze())
        .arg("verify")
        .arg(&typo)
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("Unknown key"));
    // The sandbox as systemd scores it (0 = most locked down, 10 = least): at most 2.0.
    let out = Command::new(systemd_analyze())
        .args(["security", "--offline=yes", "--threshold=20", "--no-pager"])
        .arg(&unit)
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && report.contains("Overall exposure level"),
        "systemd-analyze security: exposure above 2.0\n{report}{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

// ---- Prometheus rules and the Grafana dashboard ---------------------------------------------

/// Every rule (recording and alerting) of deploy/prometheus/alerts.yml.
fn rule_entries() -> Vec<Value> {
    let rules = yaml("deploy/prometheus/alerts.yml");
    rules["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap().clone())
        .collect()
}

/// The chapter every alert's `runbook_url` points into (`<RUNBOOK>#<alert, lowercase>`).
const RUNBOOK: &str = "docs/src/deploying.md";

/// GitHub's (and mdBook's) anchor of a Markdown heading.
fn anchor(heading: &str) -> String {
    heading
        .trim_start_matches('#')
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

#[test]
fn prometheus_rules_pass_promtool_check_and_their_unit_tests() {
    let rules = repo().join("deploy/prometheus/alerts.yml");
    let out = run_ok(Command::new(promtool()).args(["check", "rules"]).arg(&rules));
    assert!(String::from_utf8_lossy(&out.stdout).contains("SUCCESS"));
    let out = run_ok(
        Command::new(promtool())
            .args(["test", "rules", "alerts_test.yml"])
            .current_dir(repo().join("tests/deploy")),
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("SUCCESS"));

    // Every alert has a severity, texts, a runbook section in the book's deploying chapter, and
    // a unit test that sees it fire and one that sees it quiet.
    let runbook = read(RUNBOOK);
    let anchors: BTreeSet<String> = runbook.lines().filter(|l| l.starts_with('#')).map(anchor).collect();
    let tests = yaml("tests/deploy/alerts_test.yml");
    let alerts: Vec<Value> = rule_entries()
        .into_iter()
        .filter(|r| r.get("alert").is_some())
        .collect();
    for a in &alerts {
        let name = a["alert"].as_str().unwrap();
        let severity = a["labels"]["severity"].as_str().unwrap_or("");
        assert!(["critical", "warning"].contains(&severity), "{name}: severity");
        for k in ["summary", "description", "runbook_url"] {
            assert!(
                a["annotations"][k].as_str().is_some_and(|s| !s.is_empty()),
                "{name}: {k}"
            );
        }
        let url = a["annotations"]["runbook_url"].as_str().unwrap();
        let anchor = url
            .strip_prefix(&format!("{RUNBOOK}#"))
            .unwrap_or_else(|| panic!("{name}: runbook_url {url:?} is not in {RUNBOOK}"));
        assert_eq!(anchor, name.to_lowercase());
        assert!(anchors.contains(anchor), "{RUNBOOK} has no section {name}");
        let evals: Vec<&Value> = tests["tests"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|t| t["alert_rule_test"].as_array())
            .flatten()
            .filter(|e| e["alertname"] == name)
            .collect();
        let fired = |e: &&&Value| e["exp_alerts"].as_array().is_some_and(|x| !x.is_empty());
        assert!(evals.iter().any(|e| fired(&e)), "{name}: no unit test sees it fire");
        assert!(evals.iter().any(|e| !fired(&e)), "{name}: no unit test sees it quiet");
    }
    // The alerts the issue asks for.
    for wanted in [
        "MrtrNoHealthyBackend",
        "MrtrBackendDown",
        "MrtrPinsLost",
        "MrtrRouterErrorRatioHigh",
        "MrtrPinTableNearFull",
        "MrtrTokenRejectionsSpike",
        "MrtrConfigReloadFailing",
        "MrtrUpstreamTlsErrors",
    ] {
        assert!(alerts.iter().any(|a| a["alert"] == wanted), "{wanted}");
    }
}

#[test]
fn promtool_unit_tests_fail_when_an_alert_is_broken() {
    // Mutations of the rules that the unit tests must catch.
    let text = read("deploy/prometheus/alerts.yml");
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("deploy/prometheus")).unwrap();
    std::fs::create_dir_all(dir.path().join("tests/deploy")).unwrap();
    std::fs::copy(
        repo().join("tests/deploy/alerts_test.yml"),
        dir.path().join("tests/deploy/alerts_test.yml"),
    )
    .unwrap();
    for (from, to) in [
        ("ratio_rate5m > 0.05", "ratio_rate5m > 0.5"),
        ("(mrtr_ring_members) == 0", "(mrtr_ring_members) == 1"),
        (
            "increase(mrtr_pins_lost_total[5m]) > 0",
            "increase(mrtr_pins_lost_total[5m]) > 5",
        ),
        (
            "(instance:mrtr_config_reload_ok:last_time_6h or",
            "(instance:mrtr_config_reload_error:last_time_6h or",
        ),
        ("unless on (instance, backend)", "or on (instance, backend)"),
        ("mrtr:routing_max_pins > 0.8", "mrtr:routing_max_pins > 0.9"),
        (" * 0)) > 0\n", " * 0)) > 1\n"),
        (
            "{reason=~\"unknown_key|bad_signature\"}",
            "{reason=~\"unknown_key|bad_signature|expired\"}",
        ),
    ] {
        assert!(text.contains(from), "{from}");
        std::fs::write(dir.path().join("deploy/prometheus/alerts.yml"), text.replace(from, to)).unwrap();
        let out = Command::new(promtool())
            .args(["test", "rules", "alerts_test.yml"])
            .current_dir(dir.path().join("tests/deploy"))
            .output()
            .unwrap();
        assert!(
            !out.status.success(),
            "the unit tests pass with `{to}` instead of `{from}`"
        );
    }
}

/// A series selector in a PromQL expression: its metric name and its label matchers.
#[derive(Debug)]
struct Selector {
    name: String,
    matchers: Vec<(String, String, String)>,
}

/// Words of PromQL that are not metric names when no `(` follows them.
const PROMQL_KEYWORDS: [&str; 26] = [
    "sum",
    "min",
    "max",
    "avg",
    "count",
    "stddev",
    "stdvar",
    "topk",
    "bottomk",
    "quantile",
    "count_values",
    "group",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
    "inf",
    "nan",
    "atan2",
];

/// The series selectors of a PromQL expression. A small lexer: strings, `{...}` matchers,
/// `[...]` ranges, the label lists after by/without/on/ignoring/group_*, function calls,
/// keywords and numbers are told apart from metric names. Grafana's `$variables` may stand in
/// matchers and ranges.
fn selectors(expr: &str) -> Vec<Selector> {
    let b = expr.as_bytes();
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c == b':';
    let skip_ws = |mut j: usize| {
        while j < b.len() && b[j].is_ascii_whitespace() {
            j += 1;
        }
        j
    };
    let skip_string = |j: usize| {
        let mut k = j + 1;
        while b[k] != b[j] {
            k += if b[k] == b'\\' { 2 } else { 1 };
        }
        k + 1
    };
    let (mut i, mut out, mut after_metric) = (0, Vec::<Selector>::new(), false);
    while i < b.len() {
        let c = b[i];
        let was_metric = std::mem::replace(&mut after_metric, false);
        if c.is_ascii_whitespace() {
            i += 1;
            after_metric = was_metric;
        } else if c == b'#' {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if matches!(c, b'"' | b'\'' | b'`') {
            i = skip_string(i);
        } else if c == b'{' {
            assert!(was_metric, "a selector without a metric name in {expr}");
            i += 1;
            loop {
                i = skip_ws(i);
                if b[i] == b'}' {
                    i += 1;
                    break;
                }
                let start = i;
                while ident(b[i]) {
                    i += 1;
                }
                let label = expr[start..i].to_string();
                i = skip_ws(i);
                let op_start = i;
                while b"=!~".contains(&b[i]) {
                    i += 1;
                }
                let op = expr[op_start..i].to_string();
                i = skip_ws(i);
                let v_start = i;
                i = skip_string(i);
                assert!(!label.is_empty() && !op.is_empty(), "a matcher in {expr}");
                let value = expr[v_start + 1..i - 1].to_string();
                out.last_mut().unwrap().matchers.push((label, op, value));
                i = skip_ws(i);
                if b[i] == b',' {
                    i += 1;
                }
            }
        } else if c == b'[' {
            while b[i] != b']' {
                i += 1;
            }
            i += 1;
        } else if c.is_ascii_digit() || (c == b'.' && b.get(i + 1).is_some_and(u8::is_ascii_digit)) {
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'.') {
                i += 1;
            }
        } else if c == b'$' {
            i += 1;
            while i < b.len() && ident(b[i]) {
                i += 1;
            }
        } else if ident(c) {
            let start = i;
            while i < b.len() && ident(b[i]) {
                i += 1;
            }
            let word = &expr[start..i];
            let next = skip_ws(i);
            let calls = next < b.len() && b[next] == b'(';
            if calls && ["by", "without", "on", "ignoring", "group_left", "group_right"].contains(&word) {
                while b[i] != b')' {
                    i += 1;
                }
                i += 1;
            } else if !calls && !PROMQL_KEYWORDS.contains(&word) {
                out.push(Selector {
                    name: word.to_string(),
                    matchers: Vec::new(),
                });
                after_metric = true;
            }
        } else {
            i += 1;
        }
    }
    out
}

#[test]
fn the_promql_lexer_finds_metric_names() {
    let s = selectors(
        "histogram_quantile(0.99, sum by (le, backend) (rate(mrtr_request_duration_seconds_bucket{instance=~\"$instance\", a!=\"x}\"}[$__rate_interval])))\n\
         / on (instance) group_left () mrtr:routing_max_pins > bool 1e-9 unless x offset 15m or sum(y) by (z) # not_a_metric",
    );
    let names: Vec<&str> = s.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "mrtr_request_duration_seconds_bucket",
            "mrtr:routing_max_pins",
            "x",
            "y"
        ]
    );
    assert_eq!(s[0].matchers[0], ("instance".into(), "=~".into(), "$instance".into()));
    assert_eq!(s[0].matchers[1], ("a".into(), "!=".into(), "x}".into()));
}

fn dashboard() -> Value {
    serde_json::from_str(&read("deploy/grafana/mrtr-router.json")).expect("the dashboard is JSON")
}

/// Every PromQL expression of the dashboard's panels (rows' nested panels too), with its panel.
fn dashboard_exprs(d: &Value) -> Vec<(String, String)> {
    fn walk(panels: &[Value], out: &mut Vec<(String, String)>) {
        for p in panels {
            for t in p["targets"].as_array().map(Vec::as_slice).unwrap_or_default() {
                let expr = t["expr"].as_str().expect("a PromQL target");
                out.push((p["title"].as_str().unwrap().to_string(), expr.to_string()));
            }
            walk(p["panels"].as_array().map(Vec::as_slice).unwrap_or_default(), out);
        }
    }
    let mut out = Vec::new();
    walk(d["panels"].as_array().unwrap(), &mut out);
    out
}

#[test]
fn dashboard_has_the_variables_and_panels_the_issue_lists() {
    let d = dashboard();
    assert_eq!(d["uid"], "mrtr-router");
    let vars = d["templating"]["list"].as_array().unwrap();
    let var = |n: &str| {
        vars.iter()
            .find(|v| v["name"] == n)
            .unwrap_or_else(|| panic!("variable {n}"))
    };
    assert_eq!(var("datasource")["type"], "datasource");
    assert_eq!(var("datasource")["query"], "prometheus");
    let instance = var("instance");
    assert_eq!(instance["type"], "query");
    assert_eq!(instance["datasource"]["uid"], "${datasource}");
    let q = instance["query"]["query"].as_str().unwrap();
    assert!(q.starts_with("label_values(") && q.ends_with(", instance)"), "{q}");
    assert_eq!(instance["includeAll"], true);
    assert_eq!(instance["multi"], true);

    // Every panel reads the chosen datasource, on the grid, without overlaps.
    let mut ids = BTreeSet::new();
    let mut cells: Vec<(u64, u64, u64, u64, String)> = Vec::new();
    for p in d["panels"].as_array().unwrap() {
        assert!(ids.insert(p["id"].as_u64().unwrap()), "panel ids unique");
        let g = &p["gridPos"];
        let at = |k: &str| g[k].as_u64().unwrap();
        let (x, y, w, h) = (at("x"), at("y"), at("w"), at("h"));
        let title = p["title"].as_str().unwrap().to_string();
        assert!(x + w <= 24, "{title}: off the grid");
        for (x2, y2, w2, h2, t2) in &cells {
            let overlap = x < x2 + w2 && *x2 < x + w && y < y2 + h2 && *y2 < y + h;
            assert!(!overlap, "panels {title} and {t2} overlap");
        }
        cells.push((x, y, w, h, title.clone()));
        if p["type"] == "row" {
            continue;
        }
        assert!(
            p["description"].as_str().is_some_and(|s| !s.is_empty()),
            "{title}: description"
        );
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{title}");
        for t in p["targets"].as_array().unwrap() {
            assert_eq!(t["datasource"]["uid"], "${datasource}", "{title}");
        }
    }
    // ... and every series selector the chosen instances (recording rules keep `instance`).
    let exprs = dashboard_exprs(&d);
    for (title, e) in &exprs {
        for s in selectors(e) {
            let filtered = s
                .matchers
                .iter()
                .any(|(l, op, v)| l == "instance" && op == "=~" && v == "$instance");
            assert!(
                filtered || s.name == "mrtr:routing_max_pins",
                "{title}: {} is not filtered by $instance",
                s.name
            );
        }
    }
    // The issue's list: traffic and errors by backend and status, latency quantiles, route
    // decisions by source, live pins by kind and pin churn, rounds per call, backend up /
    // draining / in flight, upstream errors by kind, router errors by reason, tokens rejected by
    // reason, reloads.
    let used: BTreeSet<String> = exprs.iter().flat_map(|(_, e)| selectors(e)).map(|s| s.name).collect();
    for m in [
        "mrtr_requests_total",
        "mrtr_request_duration_seconds_bucket",
        "mrtr_route_decisions_total",
        "mrtr_pins",
        "mrtr_pins_created_total",
        "mrtr_pins_finished_total",
        "mrtr_pins_expired_total",
        "mrtr_pins_lost_total",
        "mrtr_rounds_per_call_bucket",
        "mrtr_backend_up",
        "mrtr_backend_draining",
        "mrtr_backend_inflight",
        "mrtr_upstream_errors_total",
        "mrtr_router_errors_total",
        "mrtr_tokens_rejected_total",
        "mrtr_config_reloads_total",
    ] {
        assert!(used.contains(m), "no panel shows {m}");
    }
    for (title, by) in [
        ("Requests/s by backend", "by (backend)"),
        ("Requests/s by status", "by (status)"),
        ("Route decisions by source", "by (source)"),
        ("Live pins by kind", "by (kind)"),
        ("Upstream errors/s by kind", "kind)"),
        ("Router errors/s by reason", "by (reason)"),
        ("Tokens rejected by reason", "by (reason)"),
    ] {
        assert!(
            exprs.iter().any(|(t, e)| t == title && e.contains(by)),
            "panel {title} groups {by}"
        );
    }
    for q in ["0.5", "0.9", "0.99"] {
        assert!(
            exprs
                .iter()
                .any(|(_, e)| e.contains(&format!("histogram_quantile({q},"))
                    && e.contains("mrtr_request_duration_seconds_bucket")),
            "latency quantile {q}"
        );
    }
}

// ---- The metrics they use exist on a live router -----------------------------------------------

/// The sample names on a /metrics page, each with the label names seen on its samples.
fn exposed(text: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
        let end = line.find(['{', ' ']).unwrap();
        let labels = out.entry(line[..end].to_string()).or_default();
        if line.as_bytes()[end] == b'{' {
            let close = line.rfind('}').unwrap();
            for pair in line[end + 1..close].split("\",") {
                if let Some((k, _)) = pair.split_once('=') {
                    labels.insert(k.trim_start_matches(',').to_string());
                }
            }
        }
    }
    out
}

/// Kills the router child if the test fails before stopping it.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Polls the router's /metrics until `series` has a sample (within [`CHILD_DEADLINE`]); the page.
async fn metrics_with(c: &HttpClient, admin: SocketAddr, series: &str) -> String {
    let deadline = tokio::time::Instant::now() + CHILD_DEADLINE;
    loop {
        let m = send(c, Method::GET, &format!("http://{admin}/metrics"), &[], Bytes::new()).await;
        let text = String::from_utf8(m.body.to_vec()).unwrap();
        if metric(&text, series).is_some() {
            return text;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{series} never appeared on /metrics:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn every_metric_in_the_dashboard_and_the_rules_exists_on_a_live_router() {
    // The names and label matchers the dashboard and the rules use.
    let d = dashboard();
    let mut used: Vec<(String, Selector)> = Vec::new();
    for (title, e) in dashboard_exprs(&d) {
        used.extend(
            selectors(&e)
                .into_iter()
                .map(|s| (format!("dashboard panel {title:?}"), s)),
        );
    }
    for v in d["templating"]["list"].as_array().unwrap() {
        if let Some(q) = v["query"]["query"].as_str() {
            let metric = q
                .strip_prefix("label_values(")
                .and_then(|r| r.split(',').next())
                .expect("label_values(metric, label)");
            used.extend(
                selectors(metric)
                    .into_iter()
                    .map(|s| ("dashboard variable".to_string(), s)),
            );
        }
    }
    let rules = rule_entries();
    let recorded: BTreeSet<String> = rules
        .iter()
        .filter_map(|r| r["record"].as_str().map(str::to_string))
        .collect();
    for r in &rules {
        let what = r["record"].as_str().or(r["alert"].as_str()).unwrap().to_string();
        used.extend(
            selectors(r["expr"].as_str().unwrap())
                .into_iter()
                .map(|s| (what.clone(), s)),
        );
    }
    assert!(used.len() > 50, "{}", used.len());

    // The built binary in front of two example workers and a backend that is not there, with
    // tokens, discovery and a short pin TTL: a little traffic then creates every labelled series.
    let mut workers = vec![start_worker("w1").await, start_worker("w2").await];
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("router.toml");
    let (port, admin_port) = (free_port(), free_port());
    let config = format!(
        "[server]\nlisten = \"127.0.0.1:{port}\"\n[admin]\nlisten = \"127.0.0.1:{admin_port}\"\n\
         [routing]\npin_idle_ttl = \"1s\"\n[health]\ninterval = \"1h\"\n\
         [tokens]\nkeys = [\"${{MRTR_TOKEN_KEY}}\"]\n\
         [discovery]\ndns = \"{}\"\ninterval = \"1s\"\n\
         [catalog]\nenabled = true\ninterval = \"1s\"\n\
         [[backend]]\nname = \"w1\"\nurl = \"{}\"\n[[backend]]\nname = \"w2\"\nurl = \"{}\"\n\
         [[backend]]\nname = \"gone\"\nurl = \"http://127.0.0.1:{}\"\n",
        workers[1].addr,
        workers[0].url(),
        workers[1].url(),
        free_port()
    );
    std::fs::write(&path, &config).unwrap();
    let child = Command::new(bin())
        .arg("--config")
        .arg(&path)
        .env("MRTR_TOKEN_KEY", TOKEN_KEY)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut router = Running(child);
    let c = client();
    let admin = SocketAddr::from(([127, 0, 0, 1], admin_port));
    wait_readyz(&mut router.0, &c, admin, 200, "the router to become ready").await;
    // The catalog's series, once the workers' tools are learned.
    metrics_with(&c, admin, "mrtr_tool_definitions{tool=\"whoami\"}").await;
    let url = format!("http://127.0.0.1:{port}/mcp");
    let post = |headers: Vec<(&'static str, String)>, body: String| {
        let (c, url) = (c.clone(), url.clone());
        async move {
            let h: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
            send(&c, Method::POST, &url, &h, Bytes::from(body)).await
        }
    };

    // A two-round call: requests, latency, decisions, pins created and finished, rounds.
    let first = post(vec![], start_call("deploy-1", 2).to_string()).await;
    assert_eq!(first.json()["result"]["pending"], true, "{first:?}");
    let token = first.headers["mcp-routing-id"].to_str().unwrap().to_string();
    let done = post(vec![("mcp-routing-id", token)], confirm("deploy-1", 2).to_string()).await;
    assert_eq!(done.json()["result"]["content"][0]["text"], "done", "{done:?}");
    // Router errors, and a rejected token.
    let bad = post(vec![], "not json".into()).await;
    assert_eq!(bad.router_error(), Some("parse_error"));
    let forged = post(
        vec![("mcp-routing-id", "mrt1.AAAA".into())],
        start_call("deploy-2", 2).to_string(),
    )
    .await;
    assert_eq!(forged.router_error(), Some("invalid_routing_token"));
    // A call left pending expires (pin_idle_ttl = 1s).
    let left = post(vec![], start_call("deploy-expire", 2).to_string()).await;
    assert_eq!(left.json()["result"]["pending"], true);
    metrics_with(&c, admin, "mrtr_pins_expired_total{kind=\"client\"}").await;
    // A key the ring maps to the missing backend: a connect error, then the next backend.
    let mut on_gone = None;
    for i in 0..1000 {
        let key = format!("k-{i}");
        let r = send(
            &c,
            Method::GET,
            &format!("http://{admin}/debug/route?key={key}"),
            &[],
            Bytes::new(),
        )
        .await;
        if r.json()["backend"] == "gone" {
            on_gone = Some(key);
            break;
        }
    }
    let key = on_gone.expect("a key the ring maps to the missing backend");
    let body =
        json!({"jsonrpc": "2.0", "id": 5, "messageId": key, "method": "tools/call", "params": {"name": "whoami"}});
    let moved = post(vec![], body.to_string()).await;
    assert_eq!(moved.status, 200, "{moved:?}");
    metrics_with(
        &c,
        admin,
        "mrtr_upstream_errors_total{backend=\"gone\",kind=\"connect\"}",
    )
    .await;
    // A pinned call whose worker dies: its follow-ups fail until the worker is ejected, then the
    // pin is lost.
    let lost = post(vec![], start_call("deploy-lost", 2).to_string()).await;
    let holder = lost.worker();
    let at = workers
        .iter()
        .position(|w| w.state.name == holder)
        .expect("a worker answered");
    workers.remove(at).stop().await;
    let deadline = tokio::time::Instant::now() + CHILD_DEADLINE;
    loop {
        let a = post(vec![], confirm("deploy-lost", 2).to_string()).await;
        if a.router_error() == Some("pinned_backend_unavailable") {
            break;
        }
        assert_eq!(a.router_error(), Some("upstream_unavailable"), "{a:?}");
        assert!(
            tokio::time::Instant::now() < deadline,
            "the dead worker was never ejected"
        );
    }
    // Reloads: one that succeeds, one that is rejected.
    std::fs::write(&path, format!("{config}# reloaded\n")).unwrap();
    signal(&router.0, "HUP");
    metrics_with(&c, admin, "mrtr_config_reloads_total{result=\"ok\"}").await;
    std::fs::write(&path, format!("{config}[routing]\nmax_rounds = -1\n")).unwrap();
    signal(&router.0, "HUP");
    let text = metrics_with(&c, admin, "mrtr_config_reloads_total{result=\"error\"}").await;

    // Every name the dashboard and the rules use: a recording rule of alerts.yml, or a sample
    // on /metrics with the labels their matchers name (the scrape adds `instance` and `job`).
    let samples = exposed(&text);
    let mut missing = Vec::new();
    for (what, s) in &used {
        if s.name.contains(':') {
            if !recorded.contains(&s.name) {
                missing.push(format!("{what}: {} is no recording rule of alerts.yml", s.name));
            }
            continue;
        }
        let Some(labels) = samples.get(&s.name) else {
            missing.push(format!("{what}: {} is not on /metrics", s.name));
            continue;
        };
        for (l, _, _) in &s.matchers {
            if !["instance", "job"].contains(&l.as_str()) && !labels.contains(l) {
                missing.push(format!("{what}: {} has no label {l}", s.name));
            }
        }
    }
    assert!(missing.is_empty(), "{}\n\n/metrics:\n{text}", missing.join("\n"));

    signal(&router.0, "TERM");
    let status = wait_for_exit(&mut router.0, "the router to stop on SIGTERM").await;
    assert!(status.success(), "{status}");
}
