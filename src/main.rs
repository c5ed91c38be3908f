//! `mrtr-router`, the binary: the CLI (serve, `check`, `route`, `config`, `demo`) over the
//! library.

use std::path::PathBuf;

use anyhow::Context;

/// mimalloc: the request path allocates small short-lived buffers; glibc malloc showed up at
/// ~6% of the router's CPU in profiles, mimalloc at a fraction of that.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
use clap::{Parser, Subcommand};
use mrtr_router::config::LogFormat;
use mrtr_router::{Config, Listeners, Router};

/// The version `--version` prints: the package's and the commit it was built from (`build.rs`).
const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (", env!("MRTR_COMMIT"), ")");

/// Reverse proxy for fleets of MCP servers: every round of a multi-round call reaches the
/// instance that holds it.
#[derive(Parser)]
#[command(version = VERSION, about)]
struct Cli {
    /// Config file (TOML).
    #[arg(long, global = true, default_value = "config.toml")]
    config: PathBuf,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Validate the config and print the effective config with every default.
    Check,
    /// Print which backend a client key maps to, and why.
    Route {
        /// The client key (an Mcp-Routing-Id or messageId value).
        key: Option<String>,
        /// Explain a whole JSON-RPC request body instead of a bare key.
        #[arg(long)]
        body: Option<String>,
        /// With `[auth]` on: the access token to explain (what it grants, what the request needs).
        #[arg(long = "token", value_name = "TOKEN")]
        bearer: Option<String>,
    },
    /// The config file's keys: their reference, or a complete example file.
    Config {
        #[command(subcommand)]
        what: ConfigCommand,
    },
    /// Start the router in front of built-in example workers and drive sample calls.
    Demo,
    /// The fleet's tools (`[catalog]`).
    Catalog {
        #[command(subcommand)]
        what: CatalogCommand,
    },
}

#[derive(Subcommand)]
enum CatalogCommand {
    /// Ask the backends for their tools and write the definitions they serve to `[catalog] lock`
    /// as the approved ones (the fleet must agree, unless --backend names the one to approve).
    Lock {
        /// Approve the definitions of this backend only.
        #[arg(long)]
        backend: Option<String>,
    },
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// Print the reference of every section and key as Markdown (docs/src/configuration.md).
    Reference,
    /// Print a complete config file: every key at its default, with its meaning above it.
    Example,
}

fn main() -> anyhow::Result<()> {
    no_transparent_huge_pages();
    let cli = Cli::parse();
    // One thread: a current-thread runtime, which skips the work-stealing machinery and the
    // cross-thread wake-ups that a one-worker multi-thread runtime still pays for.
    let threads = std::env::var("MRTR_WORKER_THREADS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok());
    let rt = match threads {
        Some(1) => tokio::runtime::Builder::new_current_thread().enable_all().build()?,
        Some(n) => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(n.max(1))
            .enable_all()
            .build()?,
        None => tokio::runtime::Builder::new_multi_thread().enable_all().build()?,
    };
    // Serving logs in the format its config names (`[log] format`), read before anything is
    // logged; the other commands log as text.
    let serving = match cli.command {
        None => {
            let _runtime = rt.enter();
            Some(Router::from_file(&cli.config)?)
        }
        Some(_) => None,
    };
    let format = serving
        .as_ref()
        .map_or(LogFormat::Text, |r| r.control().config().log.format);
    mrtr_router::init_logging(format);
    let result = rt.block_on(async move {
        match (cli.command, serving) {
            (None, Some(router)) => serve(router).await,
            (None, None) => unreachable!("a router is loaded to serve"),
            (Some(Command::Check), _) => {
                let config = Config::load(&cli.config)?;
                print!("{}", config.to_toml());
                for note in config.notes() {
                    eprintln!("note: {note}");
                }
                eprintln!("{}: ok", cli.config.display());
                Ok(())
            }
            (Some(Command::Route { key, body, bearer }), _) => {
                let router = Router::from_file(&cli.config)?;
                let body = body.unwrap_or_default();
                let explained = router
                    .explain(key.as_deref(), bearer.as_deref(), body.as_bytes())
                    .context("--body is not JSON")?;
                println!("{explained:#}");
                Ok(())
            }
            (Some(Command::Config { what }), _) => {
                let reference = Config::reference()?;
                match what {
                    ConfigCommand::Reference => print!("{}", reference.markdown()),
                    ConfigCommand::Example => print!("{}", reference.example()),
                }
                Ok(())
            }
            (
                Some(Command::Catalog {
                    what: CatalogCommand::Lock { backend },
                }),
                _,
            ) => {
                let router = Router::from_file(&cli.config)?;
                let (path, tools) = router
                    .lock_catalog(backend.as_deref())
                    .await
                    .map_err(anyhow::Error::msg)?;
                eprintln!("{}: {tools} tool definitions approved", path.display());
                Ok(())
            }
            (Some(Command::Demo), _) => mrtr_router::demo::run(&cli.config, ctrl_c())
                .await
                .map_err(anyhow::Error::msg),
        }
    });
    // The last lines (the shutdown's) are written before the process exits.
    mrtr_router::flush_logs(std::time::Duration::from_secs(2));
    result
}

async fn ctrl_c() {
    let _ = tokio::signal::ctrl_c().await;
}

/// Serves until SIGTERM or Ctrl-C; SIGHUP reloads the config file.
async fn serve(router: Router) -> anyhow::Result<()> {
    match mrtr_router::raise_open_file_limit() {
        Ok((soft, hard)) => tracing::info!(soft, hard, "open-file limit"),
        Err(e) => tracing::warn!(error = %e, "cannot read the open-file limit"),
    }
    let control = router.control();
    let config = control.config();
    let (listeners, activated) = Listeners::from_systemd_or_bind(&config)
        .await
        .context("binding listeners")?;
    for note in config.notes() {
        tracing::warn!("{note}");
    }
    tracing::info!(listen = %listeners.proxy.local_addr()?, tls = config.server.tls.is_some(), admin = %listeners.admin.local_addr()?, socket_activation = activated, backends = config.backends.len(), "mrtr-router started");
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
    let reloader = tokio::spawn(async move {
        while hup.recv().await.is_some() {
            let _ = control.reload();
        }
    });
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let shutdown = async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM received"),
            _ = tokio::signal::ctrl_c() => tracing::info!("interrupt received"),
        }
    };
    router.run(listeners, shutdown).await;
    reloader.abort();
    Ok(())
}

/// Turns transparent huge pages off for this process. mimalloc asks for them on its arena
/// (`madvise(MADV_HUGEPAGE)`), and where the kernel grants them (THP `madvise` or `always`),
/// memory freed in 64 KiB pages stays resident inside a 2 MiB one: with 9,500 idle keep-alive
/// connections, 6-29 MiB of the resident set were huge pages, and what each connection left
/// resident moved between 2.9 and 7.1 KiB from run to run on a ~2 KiB heap (2.2 without them;
/// the memory measurements in bench/FINDINGS.md). The router's request path touches far
/// less than one huge page covers, so the TLB gains nothing to pay that for. Not fatal: a
/// kernel without the call keeps its default.
fn no_transparent_huge_pages() {
    // SAFETY: PR_SET_THP_DISABLE takes one integer argument and touches no memory of ours.
    let _ = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
}
