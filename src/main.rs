//! `mrtr-router`, the binary: the CLI (serve, `check`, `route`, `demo`) over the library.

use std::path::PathBuf;

use anyhow::Context;

/// mimalloc: the request path allocates small short-lived buffers; glibc malloc showed up at
/// ~6% of the router's CPU in profiles, mimalloc at a fraction of that.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
use clap::{Parser, Subcommand};
use mrtr_router::{Config, Listeners, Router};

/// Reverse proxy for fleets of MCP servers: every round of a multi-round call reaches the
/// instance that holds it.
#[derive(Parser)]
#[command(version, about)]
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
    },
    /// Start the router in front of built-in example workers and drive sample calls.
    Demo,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .init();
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
    rt.block_on(async move {
        match cli.command {
            None => serve(cli.config).await,
            Some(Command::Check) => {
                let config = Config::load(&cli.config)?;
                print!("{}", config.to_toml());
                for note in config.notes() {
                    eprintln!("note: {note}");
                }
                eprintln!("{}: ok", cli.config.display());
                Ok(())
            }
            Some(Command::Route { key, body }) => {
                let router = Router::from_file(&cli.config)?;
                let body = body.unwrap_or_default();
                let explained = router
                    .explain(key.as_deref(), body.as_bytes())
                    .context("--body is not JSON")?;
                println!("{explained:#}");
                Ok(())
            }
            Some(Command::Demo) => mrtr_router::demo::run(&cli.config, ctrl_c())
                .await
                .map_err(anyhow::Error::msg),
        }
    })
}

async fn ctrl_c() {
    let _ = tokio::signal::ctrl_c().await;
}

/// Serves until SIGTERM or Ctrl-C; SIGHUP reloads the config file.
async fn serve(path: PathBuf) -> anyhow::Result<()> {
    match mrtr_router::raise_open_file_limit() {
        Ok((soft, hard)) => tracing::info!(soft, hard, "open-file limit"),
        Err(e) => tracing::warn!(error = %e, "cannot read the open-file limit"),
    }
    let router = Router::from_file(&path)?;
    let handle = router.handle();
    let config = handle.config();
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
            let _ = handle.reload();
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
