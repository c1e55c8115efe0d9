//! `mpush-bench`: the load tool and benchmark of the mpush server.
//!
//! `mpush-bench run [--quick]` starts the release `mpush-server` (and the
//! ideal server) as child processes on loopback, spreads client connections
//! over worker processes (`mpush-bench worker`, at most ~19,000 sockets each,
//! from 127.0.0.2 and up), runs the scenarios and prints each figure next to
//! the ideal server's, as text and JSON.

mod ideal;
mod report;
mod run;
mod worker;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Run the scenarios and print the figures (text, and JSON with --json).
    Run(run::RunArgs),
    /// A load process (started by `run`).
    Worker(worker::WorkerArgs),
    /// Rewrite the report from saved figures (after editing docs/bench/analysis.md).
    Report {
        /// The figures of a run (`docs/bench/results.json`).
        #[arg(long, default_value = "docs/bench/results.json")]
        from: std::path::PathBuf,
        #[arg(long, default_value = "BENCHMARKS.md")]
        out: std::path::PathBuf,
    },
    /// The minimal ideal server (started by `run`).
    Ideal {
        #[arg(long)]
        addr: String,
        /// Accept TLS with this PEM certificate chain and key.
        #[arg(long, requires = "tls_key")]
        tls_cert: Option<std::path::PathBuf>,
        #[arg(long)]
        tls_key: Option<std::path::PathBuf>,
    },
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        match cli.cmd {
            Cmd::Run(a) => run::run(a).await,
            Cmd::Worker(a) => worker::run(a).await,
            Cmd::Ideal {
                addr,
                tls_cert,
                tls_key,
            } => ideal::run(&addr, tls_cert.as_deref().zip(tls_key.as_deref())).await,
            Cmd::Report { from, out } => {
                let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&from)?)?;
                let quick = r["quick"] == true;
                report::write(&r, &out, &run::command(quick))
            }
        }
    })
}
